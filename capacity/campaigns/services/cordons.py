"""The campaign's own cordons: laid on every node it frees or keeps empty before the first
pod moves, lifted (its own only) when a node is dropped, the campaign aborted, or a kept-empty
node returned at the end. Each patch is preceded by an intent on the node's row, so a worker
killed between the patch and its record leaves a row that still says whose cordon it is."""
from __future__ import annotations

from datetime import datetime

from clusters import kube
from clusters.errors import NotFound

from capacity.campaigns.models import Campaign, CampaignNode, NodeState
from capacity.campaigns.services.record import _commit


def _node_read(gateway: kube.KubeGateway, name: str) -> dict | None:
    try:
        return gateway.get(kube.NODES, name)
    except NotFound:
        return None


def _cordoned(node: dict | None) -> bool:
    return bool(((node or {}).get("spec") or {}).get("unschedulable"))


def node_cordon(campaign: Campaign, row: CampaignNode, gateway: kube.KubeGateway, now: datetime) -> None:
    """Cordon a planned node, as `kubectl cordon` does; one already cordoned is left as it is
    and recorded as not the campaign's (it stays cordoned after the campaign)."""
    node = _node_read(gateway, row.node_name)
    if node is None:
        row.state, row.dropped_reason = NodeState.DROPPED, "the node is gone (deleted before the campaign cordoned it)"
        _commit(campaign, nodes=[row], now=now, audits=[dict(
            action="node_drop", target=f"Node/{row.node_name}", new={"reason": row.dropped_reason})])
        return
    if not _cordoned(node):
        if row.cordon_intent_at is None:
            # IMPORTANT: the intent is recorded before the patch: a worker dying right after
            # the patch leaves a row that says the cordon is the campaign's to lift.
            row.cordon_intent_at = now
            _commit(campaign, nodes=[row], now=now)
        gateway.patch(kube.NODES, row.node_name, {"spec": {"unschedulable": True}}, patch_type="strategic")
        row.cordoned_by_campaign = True
    elif row.cordon_intent_at is not None:
        row.cordoned_by_campaign = True   # our patch went out before a worker died
    row.state = NodeState.CORDONED
    audit = (dict(action="node_cordon", target=f"Node/{row.node_name}", old={"unschedulable": False},
                  new={"unschedulable": True, "role": row.role})
             if row.cordoned_by_campaign else
             dict(action="node_already_cordoned", target=f"Node/{row.node_name}", old={"unschedulable": True},
                  new={"unschedulable": True, "left_cordoned_after": True}))
    _commit(campaign, nodes=[row], now=now, audits=[audit])


def node_release(campaign: Campaign, row: CampaignNode, gateway: kube.KubeGateway, now: datetime, *, state: str,
                 reason: str = "", actor=None, label: str | None = None) -> None:
    """Lift the campaign's cordon of `row`'s node (only its own: a node cordoned before the
    campaign stays cordoned) and record the row's final `state`."""
    who = {} if actor is None and label is None else {"actor": actor, "label": label}
    audits = []
    owns = row.cordoned_by_campaign or row.cordon_intent_at is not None
    if owns and not row.uncordoned:
        node = _node_read(gateway, row.node_name)
        if node is not None and _cordoned(node):
            if row.uncordon_intent_at is None:
                row.uncordon_intent_at = now   # IMPORTANT: before the patch (see node_cordon)
                _commit(campaign, nodes=[row], now=now)
            gateway.patch(kube.NODES, row.node_name, {"spec": {"unschedulable": False}}, patch_type="strategic")
            row.uncordoned = True
        elif node is not None and row.uncordon_intent_at is not None:
            row.uncordoned = True   # our patch went out before a worker died
        if row.uncordoned:
            audits.append(dict(action="node_uncordon", target=f"Node/{row.node_name}", old={"unschedulable": True},
                               new={"unschedulable": False}, **who))
    row.state = state
    if reason:
        row.dropped_reason = reason
    row.waiting_reason = ""
    if state == NodeState.DROPPED:
        audits.append(dict(action="node_drop", target=f"Node/{row.node_name}",
                           new={"reason": row.dropped_reason, "uncordoned": row.uncordoned}, **who))
    _commit(campaign, nodes=[row], now=now, audits=audits)
