"""Kthena ModelServing (workload.serving.volcano.sh/v1alpha1): its controller, as far as
scale and pod-deletion costs go.

`spec.replicas` ServingGroups, each running every role of `spec.template.roles[]`
`replicas` times; one role replica is an entry pod plus `workerReplicas` worker pods,
named `<ms>-<group>-<role>-<roleIndex>-<worker>` (worker 0 is the entry pod).

Scale-down (of ServingGroups, and of one role's replicas inside a group) follows
Kthena's binpack order (`shared/KUBERNETES.md`, "Kthena ModelServing"): not-Running
before Running, then the SUM of the pods' `controller.kubernetes.io/pod-deletion-cost`
ascending (missing or invalid = 0), then index descending; the lowest goes first.
Scale-up fills the lowest free indexes (Kthena's own controller resumes after the
largest index; this model deliberately refills the gaps instead).
Missing pods of a replica that should exist are recreated under the same name.
"""
from __future__ import annotations

from ..resources import MODELSERVINGS, PODS
from ..store import copy
from ._serving import pod_serving, write_status_subresource
from ._util import by_controller, owner_ref

NAME_LABEL = "modelserving.volcano.sh/name"
GROUP_LABEL = "modelserving.volcano.sh/group-name"
ROLE_LABEL = "modelserving.volcano.sh/role"
ROLE_ID_LABEL = "modelserving.volcano.sh/role-id"
ENTRY_LABEL = "modelserving.volcano.sh/entry"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
_INT32 = (-(2 ** 31), 2 ** 31 - 1)


def deletion_cost(pod: dict) -> int:
    """The pod's deletion cost as the controllers read it: a base-10 int32 without `+`
    or leading zeros (k8s.io/kubernetes pkg/apis/core/helper), anything else is 0."""
    text = ((pod["metadata"].get("annotations") or {}).get(DELETION_COST))
    if not isinstance(text, str) or not text:
        return 0
    digits = text[1:] if text.startswith("-") else text
    if not digits.isdigit() or not digits.isascii() or (digits[0] == "0" and len(digits) > 1):
        return 0
    value = int(text)
    return value if _INT32[0] <= value <= _INT32[1] else 0


def _running(pods: list[dict]) -> bool:
    return bool(pods) and all(pod_serving(p) for p in pods)


def scale_down_order(units: dict[int, list[dict]]) -> list[int]:
    """Indexes of groups (or role replicas) in the order Kthena deletes them."""
    # IMPORTANT: status before cost before index, as Kthena ranks them.
    return sorted(units, key=lambda i: (_running(units[i]), sum(deletion_cost(p) for p in units[i]), -i))


def _int(value, what: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an integer, got {value!r}") from None
    if number < 0:
        raise ValueError(f"{what} must not be negative, got {number}")
    return number


class ModelServingController:
    name = "kthena"

    def reconcile(self, sim) -> None:
        store = sim.store
        servings = store.all(MODELSERVINGS)
        if not servings:
            return
        pods_by_owner = by_controller(p for p in store.all(PODS) if not p["metadata"].get("deletionTimestamp"))
        for ms in servings:
            if ms["metadata"].get("deletionTimestamp"):
                continue
            try:
                self._reconcile_one(store, ms, pods_by_owner.get(ms["metadata"]["uid"], []))
            except ValueError as exc:
                write_status_subresource(store, MODELSERVINGS, ms, {**(ms.get("status") or {}),
                                                        "observedGeneration": ms["metadata"].get("generation", 1),
                                                        "conditions": [{"type": "Available", "status": "False",
                                                                        "reason": "InvalidSpec",
                                                                        "message": str(exc)}]})

    def _reconcile_one(self, store, ms: dict, pods: list[dict]) -> None:
        spec = ms.get("spec") or {}
        replicas = _int(spec.get("replicas", 1), "spec.replicas")
        roles = (spec.get("template") or {}).get("roles") or []
        for n, role in enumerate(roles):
            if not role.get("name"):
                raise ValueError(f"spec.template.roles[{n}].name is required")
            if not role.get("entryTemplate"):
                raise ValueError(f"spec.template.roles[{n}].entryTemplate is required")
        # groups[group][role][role_index] -> pods
        groups: dict[int, dict[str, dict[int, list[dict]]]] = {}
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            group = _suffix_index(labels.get(GROUP_LABEL))
            role_index = _suffix_index(labels.get(ROLE_ID_LABEL))
            if group is None or role_index is None:
                continue
            groups.setdefault(group, {}).setdefault(labels.get(ROLE_LABEL, ""), {}) \
                .setdefault(role_index, []).append(pod)

        def group_pods(index: int) -> list[dict]:
            return [p for role in groups[index].values() for rp in role.values() for p in rp]

        if len(groups) > replicas:
            order = scale_down_order({g: group_pods(g) for g in groups})
            for g in order[:len(groups) - replicas]:
                for pod in group_pods(g):
                    store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
                del groups[g]
        index = 0
        while len(groups) < replicas:
            if index not in groups:
                groups[index] = {}
            index += 1

        for g, by_role in sorted(groups.items()):
            for role in roles:
                self._reconcile_role(store, ms, g, role, by_role.get(role["name"], {}))
        available = sum(1 for g in groups if _running(group_pods(g)) if groups[g])
        status = {"observedGeneration": ms["metadata"].get("generation", 1), "replicas": len(groups),
                  "availableReplicas": available,
                  "conditions": [{"type": "Available", "status": "True" if available >= replicas else "False",
                                  "reason": "AllGroupsReady" if available >= replicas else "GroupsNotReady"}]}
        write_status_subresource(store, MODELSERVINGS, ms, status)

    def _reconcile_role(self, store, ms: dict, group: int, role: dict, replicas_now: dict[int, list[dict]]) -> None:
        name = role["name"]
        want = _int(role.get("replicas", 1), f"role {name!r} replicas")
        workers = _int(role.get("workerReplicas", 0), f"role {name!r} workerReplicas")
        replicas_now = dict(replicas_now)
        if len(replicas_now) > want:
            for r in scale_down_order(replicas_now)[:len(replicas_now) - want]:
                for pod in replicas_now.pop(r):
                    store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        index = 0
        while len(replicas_now) < want:
            if index not in replicas_now:
                replicas_now[index] = []
            index += 1
        for r in sorted(replicas_now):
            present = {p["metadata"]["name"] for p in replicas_now[r]}
            for worker in range(workers + 1):
                pod_name = f"{ms['metadata']['name']}-{group}-{name}-{r}-{worker}"
                # A terminating pod still holds its name: the next pass recreates it.
                if pod_name in present or store.get(PODS, ms["metadata"]["namespace"], pod_name):
                    continue
                template = role["entryTemplate"] if worker == 0 else (role.get("workerTemplate") or role["entryTemplate"])
                store.create(PODS, _pod(ms, template, pod_name, group, name, r, entry=worker == 0))


def _suffix_index(value: str | None) -> int | None:
    """`sample-1` -> 1, `decode-0` -> 0: the index after the last dash."""
    tail = (value or "").rpartition("-")[2]
    return int(tail) if tail.isdigit() else None


def _pod(ms: dict, template: dict, name: str, group: int, role: str, role_index: int, *, entry: bool) -> dict:
    meta = ms["metadata"]
    tmeta = template.get("metadata") or {}
    labels = dict(tmeta.get("labels") or {})
    labels.update({NAME_LABEL: meta["name"], GROUP_LABEL: f"{meta['name']}-{group}", ROLE_LABEL: role,
                   ROLE_ID_LABEL: f"{role}-{role_index}", ENTRY_LABEL: "true" if entry else "false"})
    pod_meta = {"name": name, "namespace": meta["namespace"], "labels": labels,
                "ownerReferences": [owner_ref(ms)]}
    if tmeta.get("annotations"):
        pod_meta["annotations"] = dict(tmeta["annotations"])
    return {"metadata": pod_meta, "spec": copy(template.get("spec") or {"containers": [{"name": "main", "image": "vllm"}]})}
