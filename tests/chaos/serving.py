"""The chaos phases of serving workloads: a prune run scaling idle Deployments to zero (a
real Prometheus holds their GPU history) restored from the panel, and a runbook action
(a redeploy, then the old revision deleted to unblock it) pressed in the panel. A mixin of
`ChaosDriver`: it waits, kills and records violations through the driver."""
from __future__ import annotations

from collections import Counter
from datetime import timedelta

from kubernetes.client.exceptions import ApiException

from audit.selectors import entries_filter
from capacity.runbook.models import RunbookAction, ServedModel
from clusters.errors import KubeError
from config import clock
from pruning.models import PruneDecision, PruneRun
from tests.prometheus_fixtures import PrometheusServer, Series, gpu_labels

from .stats import ChaosStuck
from .world import PRUNE_DEPLOYMENTS, PRUNE_NODE, RUNBOOK_MODEL, Kube, prune_ns, runbook_ns

PRUNE_TASK = "pruning.tasks.prune_cluster"
REGISTRY_TASK = "capacity.runbook.tasks.registry_sync_cluster"
# The workers' pruner settings (test_chaos.py puts them in their environment): scale down for
# real, over a 10-minute idle window with no grace beyond it.
PRUNER_ENV = {"PRUNER_RUN_MODE": "scale-down", "PRUNER_DURATION_MINUTES": "10", "PRUNER_GRACE_SECONDS": "0"}
PRUNE_WINDOW_S = 600
# How far past the prune phase's start the GPU history reaches (product seconds): beyond any
# fast-forward a phase can do within the driver's PHASE_LIMIT_WALL_S.
PRUNE_HISTORY_AHEAD_S = 3 * 3600
PRESSES = 6   # how often the operator presses a panel button whose action failed before it counts as lost


class ServingPhases:
    # ---- prune scale-down and restore ----------------------------------------------------------
    def prune_phase(self, cluster, kube: Kube) -> None:
        """A prune run queued as the schedule does, its worker killed at random moments; then
        the operator restores every scale-down from the panel.

        Time: the pruner judges pod ages by the product clock against the cluster's creation
        stamps, and idleness by the GPU history at the product's "now". So the product clock
        is first moved past the pods' idle window, and the history Prometheus holds (a real
        one, backfilled) is laid along the product clock from a window before it to hours
        after, so whatever moment a run is evaluated at (after a kill, a reconcile, a beat,
        a fast-forward) finds the same history."""
        ns = prune_ns(self.index)
        pods = self.wait(lambda: _prune_pods_running(kube, ns), "the prune Deployments' pods run", limit_s=60)
        newest = max(created for _, created in pods.values())
        behind = (newest + timedelta(seconds=PRUNE_WINDOW_S + 60) - clock.now()).total_seconds()
        if behind > 0:
            self.forward(behind)
        self.prometheus_start(ns, pods)
        cluster.prometheus_url = self.prometheus.url
        cluster.save(update_fields=["prometheus_url"])
        self.kill_times = []
        self.schedule_kills(self.rng.randint(1, 3), 2.0)
        self.send_task(PRUNE_TASK, [cluster.pk])
        self.say(f"{self.where()} prune queued ({len(pods)} pods, Prometheus {self.prometheus.url})")
        # A run whose worker was killed is completed by the reconcile beat once its lease
        # lapses; owners it never reached are the next scheduled run's (fast-forwarded to).
        self.wait(lambda: _prune_settled(cluster, kube, ns), "the idle Deployments are scaled to zero, no run "
                  "left running", forward_after=8.0)
        cluster.prometheus_url = ""     # no further scheduled runs: the operator restores now
        cluster.save(update_fields=["prometheus_url"])
        self.prune_restore(cluster)
        wanted = {name: replicas for name, replicas, _ in PRUNE_DEPLOYMENTS}
        self.wait(lambda: _deployment_replicas(kube, ns) == wanted, "the restored Deployments are back")

    def prometheus_start(self, ns: str, pods: dict) -> None:
        now = clock.now()
        first, last = now - timedelta(seconds=PRUNE_WINDOW_S + 600), now + timedelta(seconds=PRUNE_HISTORY_AHEAD_S)
        moments = [first + timedelta(minutes=m) for m in range(int((last - first).total_seconds() // 60) + 1)]
        utilization = {name: float(util) for name, _, util in PRUNE_DEPLOYMENTS}   # DCGM percent
        history = [Series("DCGM_FI_DEV_GPU_UTIL", gpu_labels(ns, pod, 0, node=PRUNE_NODE),
                          [(t, utilization[owner]) for t in moments])
                   for pod, (owner, _) in pods.items()]
        server = PrometheusServer(self.workdir / f"prometheus-{self.index}")
        server.backfill(history)
        self.prometheus = server.start()

    def prune_restore(self, cluster) -> None:
        """The operator selects every acted decision in the panel, presses Restore and confirms
        the page that lists what it does; a press whose restore a fault failed is pressed again."""
        acted = PruneDecision.objects.filter(run__cluster=cluster, result=PruneDecision.Result.SUCCEEDED)
        self.stats.prune_acted += acted.count()
        for _ in range(PRESSES):
            todo = [d.pk for d in acted if d.restore != PruneDecision.Restore.RESTORED]
            if not todo:
                break
            form = {"action": "restore_selected", "_selected_action": todo}
            page = self.panel.post("/admin/pruning/prunedecision/", form)   # the confirmation page
            if page.status_code == 200 and 'name="confirm"' in page.content.decode():
                page = self.panel.post("/admin/pruning/prunedecision/", {**form, "confirm": "yes"})
            self.stats.panel_presses += 1
            if page.status_code not in (200, 302):
                self.violation(f"the panel's restore answered {page.status_code}")
                return
            acted = acted.all()
        self.stats.restores += acted.filter(restore=PruneDecision.Restore.RESTORED).count()

    def check_prune(self, cluster, kube: Kube) -> None:
        ns = prune_ns(self.index)
        running = list(PruneRun.objects.filter(cluster=cluster, status=PruneRun.Status.RUNNING)
                       .values_list("pk", flat=True))
        if running:
            self.violation(f"prune run(s) {running} left running")
        decisions = PruneDecision.objects.filter(run__cluster=cluster)
        for d in decisions.filter(result=PruneDecision.Result.ACTING):
            self.violation(f"prune decision #{d.pk} ({d.owner_name}) left acting")
        replicas = _deployment_replicas(kube, ns) or {}
        acted = Counter(decisions.filter(result=PruneDecision.Result.SUCCEEDED).values_list("owner_name", flat=True))
        for name, asked, util in PRUNE_DEPLOYMENTS:
            wanted = 1 if util == "0" else 0
            if acted[name] != wanted:
                self.violation(f"Deployment {name}: {acted[name]} acted prune decision(s), wanted {wanted}")
            if replicas.get(name) != asked:
                self.violation(f"Deployment {ns}/{name} at {replicas.get(name)} replicas, its owner asked {asked}")
        originals = {name: asked for name, asked, _ in PRUNE_DEPLOYMENTS}
        for d in decisions.filter(result=PruneDecision.Result.SUCCEEDED):
            if d.restore_state != {"replicas": originals[d.owner_name]}:
                self.violation(f"prune decision #{d.pk} ({d.owner_name}) holds restore state {d.restore_state}, "
                               f"the Deployment had {originals[d.owner_name]}")
            if d.restore != PruneDecision.Restore.RESTORED:
                self.violation(f"prune decision #{d.pk} ({d.owner_name}) not restorable: restore {d.restore!r}, "
                               f"{d.error}")
        self._check_events(kube, "gpu-capacity-pruner", "prune")

    # ---- a runbook action from the panel ---------------------------------------------------------
    def runbook_phase(self, cluster, kube: Kube) -> None:
        """The operator redeploys a 1-GPU model from the panel: its new revision waits for the
        GPU the old one holds; the registry (synced by a worker task, killed at random) shows
        it blocked, and the operator deletes the old revision from the panel to unblock it.
        Each press a fault failed is pressed again, as an operator would."""
        ns = runbook_ns(self.index)
        old = f"{RUNBOOK_MODEL}-predictor-00001"
        self.wait(lambda: _revision_pods(kube, ns) == {old: "Running"}, "the runbook model runs", limit_s=60)
        self.kill_times = []
        self.schedule_kills(self.rng.randint(1, 2), 2.0)
        self.send_task(REGISTRY_TASK, [cluster.pk])
        model = self.wait(lambda: ServedModel.objects.filter(cluster=cluster, namespace=ns, name=RUNBOOK_MODEL,
                                                             ready=True, gone=False).first(),
                          "a registry sync lists the model", forward_after=8.0)
        self.press(lambda: self.panel.post("/admin/capacity/servedmodel/", {
            "action": "redeploy", "_selected_action": [model.pk], "confirm": "yes"}),
            done=lambda: RunbookAction.objects.filter(cluster=cluster, action="model_redeploy",
                                                     state=RunbookAction.State.DONE).exists(),
            what="redeploy")
        self.schedule_kills(self.rng.randint(0, 2), 2.0)
        self.send_task(REGISTRY_TASK, [cluster.pk])
        self.wait(lambda: any(b["old_revision"] == old for b in ServedModel.objects.get(pk=model.pk).blocked),
                  "a registry sync shows the new revision blocked by the old one", forward_after=8.0)
        self.press(lambda: self.panel.post(f"/admin/capacity/servedmodel/{model.pk}/unblock/{old}/",
                                           {"confirm": "yes"}),
                   done=lambda: RunbookAction.objects.filter(cluster=cluster, action="revision_delete_old",
                                                             state=RunbookAction.State.DONE).exists(),
                   what="unblock")
        new = f"{RUNBOOK_MODEL}-predictor-00002"
        self.wait(lambda: _revision_pods(kube, ns) == {new: "Running"}, "the new revision runs on the freed GPU")

    def press(self, action, *, done, what: str) -> None:
        for _ in range(PRESSES):
            self.stats.panel_presses += 1
            try:
                page = action()
            except KubeError as exc:      # the page failed: what did the press do?
                self.violation(f"the panel's {what} answered an error page ({exc}); done: {done()}")
            else:
                if page.status_code not in (200, 302):
                    raise ChaosStuck(f"{self.where()} the panel's {what} answered {page.status_code}")
            if done():
                self.stats.runbook_actions += 1
                return
            self.tick()
        raise ChaosStuck(f"{self.where()} the panel's {what} not done after {PRESSES} presses")

    def check_runbook(self, cluster, kube: Kube) -> None:
        ns = runbook_ns(self.index)
        # A press a fault failed leaves a truthful `failed` row and is pressed again; what must
        # hold is that each action was done once.
        audits = Counter(RunbookAction.objects.filter(cluster=cluster, state=RunbookAction.State.DONE)
                         .values_list("action", "target"))
        wanted = {("model_redeploy", f"{ns}/{RUNBOOK_MODEL}"): 1,
                  ("revision_delete_old", f"{ns}/{RUNBOOK_MODEL}-predictor-00001"): 1}
        if dict(audits) != wanted:
            self.violation(f"runbook actions {dict(audits)}, wanted each action done once: {wanted}")
        entries = Counter(entries_filter(app="runbook", cluster=cluster, action__in=[a for a, _ in wanted])
                          .values_list("action", "target"))
        if dict(entries) != wanted:
            self.violation(f"runbook audit entries {dict(entries)}, wanted each action done audited once: {wanted}")
        revisions = sorted(r["metadata"]["name"] for r in kube.custom.list_namespaced_custom_object(
            "serving.knative.dev", "v1", ns, "revisions")["items"])
        if revisions != [f"{RUNBOOK_MODEL}-predictor-00002"]:
            self.violation(f"runbook model revisions {revisions}: wanted only the redeployed one")


def _quietly(read, default=None):
    """A read of the faulty cluster, as a poll: a fault answers `default`, the next poll tries again."""
    try:
        return read()
    except ApiException:
        return default


def _prune_pods_running(kube: Kube, ns: str) -> dict | None:
    """{pod: (Deployment, created)} once every prune Deployment's pods run, else None."""
    items = _quietly(lambda: kube.core.list_namespaced_pod(ns).items)
    if items is None:
        return None
    pods = {p.metadata.name: (p.metadata.labels["app"], p.metadata.creation_timestamp) for p in items
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp}
    return pods if len(pods) == sum(replicas for _, replicas, _ in PRUNE_DEPLOYMENTS) else None


def _deployment_replicas(kube: Kube, ns: str) -> dict | None:
    items = _quietly(lambda: kube.apps.list_namespaced_deployment(ns).items)
    return None if items is None else {d.metadata.name: d.spec.replicas for d in items}


def _prune_settled(cluster, kube: Kube, ns: str) -> bool:
    if PruneRun.objects.filter(cluster=cluster, status=PruneRun.Status.RUNNING).exists():
        return False
    decisions = PruneDecision.objects.filter(run__cluster=cluster)
    if decisions.filter(result=PruneDecision.Result.ACTING).exists():
        return False
    idle = {name for name, _, util in PRUNE_DEPLOYMENTS if util == "0"}
    acted = set(decisions.filter(result=PruneDecision.Result.SUCCEEDED).values_list("owner_name", flat=True))
    replicas = _deployment_replicas(kube, ns)
    return acted >= idle and replicas is not None and all(replicas[name] == 0 for name in idle)


def _revision_pods(kube: Kube, ns: str) -> dict | None:
    items = _quietly(lambda: kube.core.list_namespaced_pod(
        ns, label_selector=f"serving.kserve.io/inferenceservice={RUNBOOK_MODEL}").items)
    if items is None:
        return None
    return {p.metadata.labels["serving.knative.dev/revision"]: p.status.phase for p in items
            if not p.metadata.deletion_timestamp}
