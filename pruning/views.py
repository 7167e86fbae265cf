"""A dry run of the pruner started from the panel (staff with `pruning.add_prunerun`): what
it would scale to zero now, nothing changed. The dashboard's "Last prune runs" holds its form."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from clusters.selectors import cluster_find
from config import clock

from pruning.services import PruneParamError, prune_dry_run_start

DRY_RUN_PERMISSION = "pruning.add_prunerun"
FIELDS = {"window_seconds": "idle window", "grace_seconds": "grace period"}   # the form's names of run parameters


def _whole(text: str, what: str) -> int | None:
    text = (text or "").strip()
    if not text:
        return None   # the setting's value
    if not text.isdigit():
        raise PruneParamError("", f"{what} must be a whole number, got {text!r}")
    return int(text)


@staff_member_required
@permission_required(DRY_RUN_PERMISSION, raise_exception=True)
@require_POST
def prune_dry_run(request, cluster: str):
    row = cluster_find(name=cluster)
    if row is None:
        raise Http404(f"no cluster named {cluster!r}")
    try:
        started = prune_dry_run_start(cluster=row, actor=request.user, now=clock.now(),
                                      window_minutes=_whole(request.POST.get("window_minutes"), "the idle window (minutes)"),
                                      grace_seconds=_whole(request.POST.get("grace_seconds"), "the grace period (seconds)"))
    except PruneParamError as exc:
        field = FIELDS.get(exc.field, "")
        messages.error(request, f"Dry run not started, nothing recorded: {field + ': ' if field else ''}{exc}")
        return redirect("capacity:dashboard", cluster=row.name)
    (messages.error if started.error else messages.success)(request, started.summary())
    if started.run is None:
        return redirect("capacity:dashboard", cluster=row.name)
    return redirect("admin:pruning_prunerun_change", started.run.pk)
