"""Every label, annotation and resource key the product reads or writes on a cluster, in
one place: the upstream ones (Kubernetes, Knative, KServe, Karpenter, Kthena, the NVIDIA
device plugin) and the product's own `capacity.io/` keys.

Pure constants: planning, selectors and services import them from here, never spell them.
"""
from __future__ import annotations

# ---- resources and node labels (NVIDIA device plugin, GPU feature discovery) ------------------
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

# Labels cloud providers and Karpenter put on a node to name its pool, in order of preference.
NODE_POOL_LABELS = ("karpenter.sh/nodepool", "cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup",
                    "agentpool", "node.kubernetes.io/instance-type")

# ---- Kubernetes ------------------------------------------------------------------------------
TEMPLATE_HASH_LABEL = "pod-template-hash"  # what ties a ReplicaSet's pods to it, with the owner reference
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"  # a static pod's mirror: the kubelet owns it
# The ReplicaSet controller removes lower costs first when it scales down (beta since 1.22).
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
APP_VERSION_LABEL = "app.kubernetes.io/version"

# ---- what node-emptying tools honour (kubectl drain, Karpenter, cluster-autoscaler) ------------
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"

# ---- Knative Serving --------------------------------------------------------------------------
KNATIVE_SERVICE_LABEL = "serving.knative.dev/service"
REVISION_LABEL = "serving.knative.dev/revision"
REVISION_UID_LABEL = "serving.knative.dev/revisionUID"
RELEASE_LABEL = "serving.knative.dev/release"  # the Knative release an install was made from
# The autoscaling annotations, on a Revision (or its Service's template) and its PodAutoscaler;
# Knative still reads the camelCase spellings of older releases.
MIN_SCALE = "autoscaling.knative.dev/min-scale"
MIN_SCALE_LEGACY = "autoscaling.knative.dev/minScale"
INITIAL_SCALE = "autoscaling.knative.dev/initial-scale"
INITIAL_SCALE_LEGACY = "autoscaling.knative.dev/initialScale"
TARGET_CONCURRENCY = "autoscaling.knative.dev/target"

# ---- KServe -----------------------------------------------------------------------------------
ISVC_LABEL = "serving.kserve.io/inferenceservice"
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"  # "Serverless" (Knative) or raw Deployments
KSERVE_STOP_ANNOTATION = "serving.kserve.io/stop"  # "true": KServe (>= 0.15) scales the model to zero

# ---- Kubeflow: a Notebook with this annotation is stopped (its StatefulSet at zero) -------------
NOTEBOOK_STOP_ANNOTATION = "kubeflow-resource-stopped"

# ---- Kthena (Volcano model serving): scale-down compares the sums of a group's pod costs ------
KTHENA_NAME_LABEL = "modelserving.volcano.sh/name"
KTHENA_GROUP_LABEL = "modelserving.volcano.sh/group-name"

# ---- the product's own keys -------------------------------------------------------------------
ORG_LABEL = "capacity.io/org"  # on a namespace or a workload: the org it belongs to
MODEL_LABEL = "capacity.io/model"  # the model several deployed versions share
COMPONENT_LABEL = "capacity.io/component"
PYNODE_COMPONENT = "pynode"  # COMPONENT_LABEL's value on a pynode Knative Service
REDEPLOY_ANNOTATION = "capacity.io/redeployed-at"  # the runbook's "redeploy": a new revision, no other change
BINPACK_MARKER = "capacity.io/binpack-deletion-cost"  # the cost binpack wrote: a different cost was set by hand
BINPACK_OPT_OUT = "capacity.io/binpack"  # "false" on a workload: binpack leaves its pods alone
SERVING_GROUP_LABEL = "capacity.io/serving-group"  # binpack's default group label (BINPACK_GROUP_LABEL)
PRUNE_OPT_OUT = "capacity.io/prune"  # "false" on a workload: the pruner leaves it alone
# The owner's own floors, recorded by the dormancy switch before it sets its "0" and given back on restore.
OWNER_MIN_SCALE = "capacity.io/owner-min-scale"
OWNER_INITIAL_SCALE = "capacity.io/owner-initial-scale"
