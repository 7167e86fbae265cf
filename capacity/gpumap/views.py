"""The GPU map and the cluster dashboard (staff with `capacity.view_cluster_contents`).

The dashboard shows GPUs by product, fragmentation, dormant orgs, defrag jobs and the last
prune runs: two Kubernetes API calls and a few small queries, whatever the size of the cluster."""
from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import render

from clusters.errors import KubeError
from clusters.selectors import cluster_find, clusters_all
from config import clock
from orgs.selectors import org_counts
from pruning.selectors import prune_runs_recent

from capacity.defrag.models import RUNNING_STATES, DefragJob
from capacity.defrag.services import defrag_job_holding_reason
from capacity.gpumap.planning import gpu_summary
from capacity.selectors import defrag_jobs_newest_by_node, fragmentation_for

CELL = 18  # px per GPU cell in the map
LABEL_WIDTH = 330  # px for the node name column
NODES_PER_PAGE = 100  # map rows per page: a 1,000-node fleet is ten pages, not one huge SVG
TOP_CANDIDATES = 25  # "where to defrag" rows shown (the best first)

RECENT = 5  # recent jobs and prune runs shown
REFRESH_SECONDS = 10  # the page reloads its content on its own while it is open

# Staff status opens the admin, not the cluster: the dashboard and the GPU map name
# orgs, models and nodes, so they want this permission, checked before any API call.
CLUSTER_CONTENTS_PERMISSION = "capacity.view_cluster_contents"


def cluster_contents_required(view):
    """Anonymous → the login page; staff without the permission → 403, before the view runs."""
    return staff_member_required(permission_required(CLUSTER_CONTENTS_PERMISSION, raise_exception=True)(view))


@cluster_contents_required
def gpu_map(request, cluster: str):
    cluster_row = cluster_find(name=cluster)
    if cluster_row is None:
        raise Http404(f"no cluster named {cluster!r}")
    pool = request.GET.get("pool") or None
    try:
        view = fragmentation_for(cluster=cluster_row, now=clock.now(), pool=pool)
    except KubeError as exc:
        return render(request, "capacity/gpu_map.html", {"cluster": cluster_row, "error": str(exc)}, status=502)
    page = Paginator(view.rows, NODES_PER_PAGE).get_page(request.GET.get("page"))
    width = max((len(r.cells) for r in page.object_list), default=8)
    rows = [{"row": r, "y": i * (CELL + 6), "cells": [{"x": LABEL_WIDTH + j * CELL, "cell": c}
                                                       for j, c in enumerate(r.cells)]}
            for i, r in enumerate(page.object_list)]
    legend = sorted({(c.org, c.model, c.colour) for r in page.object_list for c in r.cells if c.pod})
    # Cordoned nodes, and who holds them: a defrag job that rests offers "return to service".
    newest = defrag_jobs_newest_by_node(cluster=cluster_row)
    may_return = request.user.has_perm("capacity.return_to_service_defragjob")
    cordoned = []
    for r in view.rows:
        if not r.cordoned:
            continue
        job = newest.get(r.name)
        cordoned.append({"row": r, "job": job,
                         "returnable": may_return and job is not None and not defrag_job_holding_reason(job)})
    return render(request, "capacity/gpu_map.html", {
        "title": f"GPU map — {cluster_row.name}",
        "cluster": cluster_row, "view": view, "rows": rows, "pool": pool, "legend": legend, "page": page,
        "candidates": view.candidates[:TOP_CANDIDATES], "cordoned": cordoned,
        "svg_width": LABEL_WIDTH + width * CELL + 180, "svg_height": max(len(rows), 1) * (CELL + 6),
        "cell": CELL - 2, "text_x": LABEL_WIDTH + width * CELL + 8,
    })


@cluster_contents_required
def dashboard(request, cluster: str):
    cluster_row = cluster_find(name=cluster)
    if cluster_row is None:
        raise Http404(f"no cluster named {cluster!r}")
    context = {"cluster": cluster_row, "clusters": clusters_all(),
               "refresh_seconds": REFRESH_SECONDS, "title": f"Dashboard — {cluster_row.name}"}
    try:
        context["gpus"] = gpu_summary(fragmentation_for(cluster=cluster_row, now=clock.now()))
    except KubeError as exc:
        context["error"] = str(exc)
    orgs = org_counts(cluster=cluster_row)
    jobs = DefragJob.objects.filter(cluster=cluster_row)
    context.update({
        "orgs_total": orgs["total"],
        "orgs_dormant": orgs["dormant"],
        "orgs_protected": orgs["protected"],
        "orgs_drifting": orgs["drifting"],
        "jobs_running": list(jobs.filter(state__in=RUNNING_STATES)),
        "jobs_recent": list(jobs.exclude(state__in=RUNNING_STATES)[:RECENT]),
        "prune_runs": prune_runs_recent(cluster=cluster_row, limit=RECENT),
    })
    status = 502 if "error" in context else 200
    return render(request, "capacity/dashboard.html", context, status=status)
