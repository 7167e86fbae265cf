"""The home dashboard per cluster (staff with `capacity.view_cluster_contents`): GPUs by product, fragmentation, dormant
orgs, defrag jobs, last prune runs. Two Kubernetes API calls and a few small queries,
whatever the size of the cluster."""
from __future__ import annotations

from django.http import Http404
from django.shortcuts import render

from clusters.errors import KubeError
from clusters.models import Cluster
from config import clock
from orgs.models import Org
from pruning.models import PruneRun

from capacity.dashboard import gpu_summary
from capacity.models import RUNNING_STATES, DefragJob
from capacity.selectors import fragmentation_for
from capacity.views import cluster_contents_required

RECENT = 5  # recent jobs and prune runs shown
REFRESH_SECONDS = 10  # the page reloads its content on its own while it is open


@cluster_contents_required
def dashboard(request, cluster: str):
    cluster_row = Cluster.objects.filter(name=cluster).first()
    if cluster_row is None:
        raise Http404(f"no cluster named {cluster!r}")
    context = {"cluster": cluster_row, "clusters": Cluster.objects.order_by("name"),
               "refresh_seconds": REFRESH_SECONDS, "title": f"Dashboard — {cluster_row.name}"}
    try:
        context["gpus"] = gpu_summary(fragmentation_for(cluster=cluster_row, now=clock.now()))
    except KubeError as exc:
        context["error"] = str(exc)
    orgs = Org.objects.filter(cluster=cluster_row)
    jobs = DefragJob.objects.filter(cluster=cluster_row)
    context.update({
        "orgs_total": orgs.count(),
        "orgs_dormant": orgs.filter(dormant=True).count(),
        "orgs_protected": orgs.filter(scale_to_zero_allowed=False).count(),
        "orgs_drifting": orgs.exclude(drift=[]).count(),
        "jobs_running": list(jobs.filter(state__in=RUNNING_STATES)),
        "jobs_recent": list(jobs.exclude(state__in=RUNNING_STATES)[:RECENT]),
        "prune_runs": list(PruneRun.objects.filter(cluster=cluster_row).order_by("-started_at")[:RECENT]),
    })
    status = 502 if "error" in context else 200
    return render(request, "capacity/dashboard.html", context, status=status)
