"""The one writer of the audit trail."""
from __future__ import annotations

from datetime import datetime

from audit.models import AuditEntry

_CAUSE_MAX = AuditEntry._meta.get_field("cause").max_length
_TARGET_MAX = AuditEntry._meta.get_field("target").max_length


def audit(*, app: str, action: str, at: datetime, actor=None, cause: str = "", target: str = "",
          cluster=None, cluster_id: int | None = None, org=None, subject: tuple[str, int] | None = None, old: dict | None = None,
          new: dict | None = None, actor_label: str | None = None) -> AuditEntry:
    """Record one change. `actor` is the panel user (None for a command, a worker, the
    schedule); the command's or token's label is taken from `config.actors` unless given.
    `subject` is the app's own record the entry belongs to, as ("defrag_job", id). The
    cluster is given as a row or its id; an org's entry defaults to the org's cluster."""
    subject_type, subject_id = subject if subject is not None else ("", None)
    extra = {} if actor_label is None else {"actor_label": actor_label}
    if cluster is not None:
        extra["cluster"] = cluster
    elif cluster_id is not None:
        extra["cluster_id"] = cluster_id
    elif org is not None:
        extra["cluster_id"] = org.cluster_id   # an org's entry is about the org's cluster
    return AuditEntry.objects.create(
        app=app, action=action, at=at, actor=actor, cause=(cause or "")[:_CAUSE_MAX],
        target=(target or "")[:_TARGET_MAX], org=org, subject_type=subject_type,
        subject_id=subject_id, old=old or {}, new=new or {}, **extra)
