"""Writes: an org that is gone is retired (kept with its switches, holds and audit entries);
only an org nothing names may be deleted. Both are audited. Nothing is sent to the cluster."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from audit.services import audit as audit_write
from config.actors import actor_label_current
from config.records import RecordsKept, records_kept_message, records_naming
from orgs.models import Org, ScaleToZero


@dataclass
class RetireOutcome:
    org: str
    retired: bool       # False: it was already retired, nothing changed
    left_enabled: bool  # its workloads last held min-scale 0 and are left so

    def describe(self) -> str:
        if not self.retired:
            return f"{self.org}: already retired, nothing changed"
        said = f"{self.org}: retired (kept with its history; no sweep, prune or reconcile acts on it any more)"
        if self.left_enabled:
            said += "; its workloads keep scale to zero as last applied: nothing on the cluster was changed"
        return said


def org_retire(*, org: Org, actor, now: datetime, cause: str = "") -> RetireOutcome:
    """Retire an org that is gone: out of the sweep, the reconcile, the pruner's holds and
    every list that acts, kept with its history and shown in it."""
    with transaction.atomic():
        locked = Org.all_objects.select_for_update().get(pk=org.pk)
        left_enabled = locked.applied == ScaleToZero.ENABLED
        if locked.retired:
            return RetireOutcome(org=locked.slug, retired=False, left_enabled=left_enabled)
        label = "" if actor is not None else actor_label_current()
        Org.all_objects.filter(pk=org.pk).update(retired_at=now, retired_by=actor, retired_by_label=label)
        audit_write(app="orgs", action="org_retired", at=now, actor=actor, cause=cause or "retired by an operator",
                    target=f"Org/{locked.slug}", org=locked, subject=("org", locked.pk),
                    old={"retired_at": None, "dormant": locked.dormant, "applied": locked.applied},
                    new={"retired_at": now.isoformat()})
    org.retired_at, org.retired_by, org.retired_by_label = now, actor, label
    return RetireOutcome(org=org.slug, retired=True, left_enabled=left_enabled)


def org_delete(*, org: Org, actor, now: datetime) -> None:
    """Delete an org nothing names (registered by mistake, never switched, held or audited),
    audited. Raises `RecordsKept` saying what names it otherwise: such an org is retired."""
    with transaction.atomic():
        locked = Org.all_objects.select_for_update().get(pk=org.pk)
        kept = records_naming(locked)
        if kept:
            raise RecordsKept(records_kept_message(locked, kept))
        old = {"slug": locked.slug, "namespace": locked.namespace, "cluster": locked.cluster.name}
        pk, cluster_id = locked.pk, locked.cluster_id
        locked.delete()
        # The entry names the org by text only: a foreign key would name a row that is gone.
        audit_write(app="orgs", action="org_deleted", at=now, actor=actor, cause="it named no record",
                    target=f"Org/{old['slug']}", cluster_id=cluster_id, subject=("org", pk), old=old, new={})
