"""The GPU map and the cluster dashboard (staff with `capacity.view_cluster_contents`).

The dashboard shows GPUs by product, fragmentation, dormant orgs, defrag jobs and the last
prune runs: a paged LIST of nodes and one of pods and a few small queries, whatever the size
of the cluster, and not even those LISTs while a reading of the cluster younger than
`CAPACITY_MAP_CACHE_SECONDS` serves it, or a little older one while the next is drawn in the
background (both pages say how old their data is, and when a refresh failed)."""
from __future__ import annotations

import functools
from html import escape  # what django.utils.html.escape calls, without its lazy-string wrapper
from urllib.parse import quote

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.safestring import mark_safe

from clusters.errors import KubeError
from clusters.selectors import cluster_find, clusters_all
from clusters.snapshot import gc_paused
from config import clock
from config.actors import actor_describe
from orgs.selectors import org_counts
from pruning.selectors import prune_runs_recent

from capacity.campaigns.display import moves_by_node, node_marks, proposal_lines
from capacity.campaigns.selectors import campaign_policies, proposals_latest
from capacity.defrag.models import RUNNING_STATES, DefragJob
from capacity.defrag.services import defrag_job_holding_reason
from capacity.gpumap.planning import GpuCell, NodeRow, Swatch
from capacity.gpumap.selectors import (
    REFRESH_WAIT_SECONDS,
    Reading,
    fragmentation_recent,
    gpu_summary_recent,
    read_shared,
)
from capacity.selectors import defrag_jobs_newest_by_node
from capacity.defrag.planning import seconds_text
from config.schedule import SCHEDULES

CELL = 18  # px per GPU cell in the map
LABEL_WIDTH = 330  # px for the node name column
# Characters of a node name drawn in that column (12 px monospace, ~7.2 px a character, from
# x=34 px): a longer name ends in "…", and its full text is the label's title.
NAME_CHARS = 40
NODES_PER_PAGE = 100  # map rows per page: a 1,000-node fleet is ten pages, not one huge SVG
TOP_CANDIDATES = 25  # "where to defrag" rows shown (the best first)
CAMPAIGN_WIDTH = 320  # px beside the map's rows for a campaign node's position and moves (MARK_CHARS)
USED_WIDTH = 72  # px for a row's "used" text ("8/8 used", "128/128 used") before a campaign mark

RECENT = 5  # recent jobs and prune runs shown
CAMPAIGN_PROPOSALS_SCHEDULE = "capacity: campaign proposals"   # config/schedule.py
REFRESH_SECONDS = 10  # the page reloads its content on its own while it is open

# Staff status opens the admin, not the cluster: the dashboard and the GPU map name
# orgs, models and nodes, so they want this permission, checked before any API call.
CLUSTER_CONTENTS_PERMISSION = "capacity.view_cluster_contents"
# What the map's buttons lead to wants its own permission (capacity/defrag/admin.py): a
# button is shown only to who holds it, the others read what it needs.
START_PERMISSION = "capacity.add_defragjob"
RETURN_PERMISSION = "capacity.return_to_service_defragjob"
DRY_RUN_PERMISSION = "pruning.add_prunerun"   # pruning/views.py's dry run, started from the dashboard


def cluster_contents_required(view):
    """Anonymous → the login page; staff without the permission → 403, before the view runs."""
    return staff_member_required(permission_required(CLUSTER_CONTENTS_PERMISSION, raise_exception=True)(view))


def collector_paused(view):
    """Python's cyclic collector paused while the page is drawn. A page of a 5,000-node cluster
    is drawn from tens of thousands of new objects (a reading of the cluster, or one loaded
    from the cache), none of them cyclic: a collection that ran in the middle walked them all
    (measured at 5,000 nodes: 15-45 ms, against 0.5-0.8 s for the page), only for reference
    counting to free them when the page is done."""
    @functools.wraps(view)
    def paused(request, *args, **kwargs):
        with gc_paused():
            return view(request, *args, **kwargs)
    return paused


# The patterns of planning.PATTERNS, drawn in a 6 px tile over the swatch's colour, dark at
# 45 % so they show on the palette's light yellow and its dark blue alike.
_PATTERN_MARKS = {
    "stripes": '<rect width="2" height="6" fill="#000" fill-opacity="0.45"/>',
    "dots": '<circle cx="3" cy="3" r="1.6" fill="#000" fill-opacity="0.45"/>',
    "cross": ('<rect y="2.25" width="6" height="1.5" fill="#000" fill-opacity="0.45"/>'
              '<rect x="2.25" width="1.5" height="6" fill="#000" fill-opacity="0.45"/>'),
}


_ROTATE = ' patternTransform="rotate(45)"'   # stripes run diagonally


def _fill(colour: str, pattern: str) -> str:
    """A cell's or swatch's SVG fill: the colour, or the pattern tile drawn over it."""
    return f"url(#sw-{colour.lstrip('#')}-{pattern})" if pattern else colour


def _pattern_defs(swatches) -> str:
    """<pattern> tiles for the patterned swatches shown (palette colours: no outside text)."""
    return mark_safe("".join(   # noqa: S308 - colours and patterns come from planning's fixed lists
        f'<pattern id="sw-{s.colour.lstrip("#")}-{s.pattern}" width="6" height="6" patternUnits="userSpaceOnUse"'
        f'{_ROTATE if s.pattern == "stripes" else ""}>'
        f'<rect width="6" height="6" fill="{s.colour}"/>{_PATTERN_MARKS[s.pattern]}</pattern>'
        for s in sorted(swatches) if s.pattern in _PATTERN_MARKS))


def _cells_svg(row: NodeRow, cells: tuple[GpuCell, ...]) -> str:
    """A node's GPU cells as SVG rects. Built here rather than in the template: a page of
    100 eight-GPU nodes is 800 cells, which the template engine drew in ~50 ms. A pod's
    cells differ only in x, so each distinct cell's colour and title are escaped once."""
    escaped: dict[GpuCell, tuple[str, str]] = {}
    opacity = "" if row.takes_pods else ' fill-opacity="0.5"'
    free = "free" if row.takes_pods else f"free, but the node {'is not Ready' if not row.ready else 'is cordoned'}"
    size = CELL - 2
    parts = []
    for j, cell in enumerate(cells):
        colour_title = escaped.get(cell)
        if colour_title is None:
            colour_title = escaped[cell] = (escape(_fill(cell.colour, cell.pattern)),
                                            escape(f"{cell.pod} ({cell.org}/{cell.model})" if cell.pod else free))
        colour, title = colour_title
        parts.append(f'<rect x="{LABEL_WIDTH + j * CELL}" y="0" width="{size}" height="{size}" fill="{colour}" '
                     f'stroke="#555" stroke-width="0.5"{opacity}><title>{title}</title></rect>')
    return mark_safe("".join(parts))   # noqa: S308 - the only outside text, colour and title, is escaped


def _legend_html(legend: list[tuple[str, str, Swatch]]) -> str:
    """The legend's org/model entries, (org, model, swatch) each, as list items: the swatch
    drawn as its cells are, and the name on one line (cut with "…", whole in the title). Built
    here for the reason the cells are: a page of 100 nodes may show several hundred models (611
    on a page of the 1,000-node bench cluster), which the template engine drew in ~20 ms."""
    return mark_safe("".join(   # noqa: S308 - org, model and swatch, the only outside text, are escaped
        f'<li class="model" title="{escape(org)} / {escape(model)}"><svg class="swatch" width="14" height="14" '
        f'aria-hidden="true"><rect width="14" height="14" fill="{escape(_fill(swatch.colour, swatch.pattern))}" '
        f'stroke="#555" stroke-width="0.5"/></svg> {escape(org)} / {escape(model)}</li>'
        for org, model, swatch in legend))


def _node_label(row: NodeRow) -> tuple[str, bool]:
    """The node's name as the map draws it, with " (NotReady)" when it is not Ready, in
    NAME_CHARS at most; and whether the name was cut."""
    suffix = "" if row.ready else " (NotReady)"
    room = NAME_CHARS - len(suffix)
    if len(row.name) <= room:
        return row.name + suffix, False
    return row.name[:room - 1] + "…" + suffix, True


def _data_age(read: Reading, now) -> dict:
    """What the page says of its data's age: seconds, the UTC time of the reading, how long a
    reading serves, and for an older one being refreshed, when that was asked for and how
    the last refresh failed, if it did."""
    return {"data_age": read.age_seconds(now), "data_taken_at": read.taken_at,
            "data_kept_seconds": settings.CAPACITY_MAP_CACHE_SECONDS,
            "data_refresh_asked_at": read.refresh_asked_at, "data_refresh_failed": read.refresh_failed,
            "data_refresh_wait": REFRESH_WAIT_SECONDS if read_shared() else 0}


@cluster_contents_required
@collector_paused
def gpu_map(request, cluster: str):
    cluster_row = cluster_find(name=cluster)
    if cluster_row is None:
        raise Http404(f"no cluster named {cluster!r}")
    pool = request.GET.get("pool") or None
    now = clock.now()
    try:
        read = fragmentation_recent(cluster=cluster_row, now=now, pool=pool)
    except KubeError as exc:
        return render(request, "capacity/gpu_map.html", {"cluster": cluster_row, "error": str(exc)}, status=502)
    view = read.value
    if pool is not None and not view.rows:
        # The cluster was read: the pool matches no node. Name the pools there are (the whole
        # reading is the one just drawn or cached, not read again).
        pools = sorted(fragmentation_recent(cluster=cluster_row, now=now).value.pools)
        return render(request, "capacity/gpu_map.html", {
            "cluster": cluster_row, "pool": pool, "pool_choices": pools,
            "no_pool": f"no GPU node in pool {pool!r} on {cluster_row.name}: the pool matches no node"}, status=404)
    # The page's context holds what the page shows, not the whole reading: Django's template
    # rendering leaves its context in a reference cycle, kept until the cyclic collector runs,
    # and a reading of 5,000 nodes is tens of thousands of objects for it to walk then. The
    # paginator counts the rows by position; only the page's own rows are looked up.
    page = Paginator(range(len(view.rows)), NODES_PER_PAGE).get_page(request.GET.get("page"))
    shown = view.rows[page.object_list.start:page.object_list.stop]
    # Made once per row: the SVG, its width and the legend read them.
    cells = [r.cells_in(view.swatches) for r in shown]
    width = max(map(len, cells), default=8)
    campaign = _campaign_context(cluster_row, pool, now, marked=request.GET.get("campaign") == "1")
    marks = campaign["marks"]
    rows = [{"row": r, "y": i * (CELL + 6), "cells": _cells_svg(r, c), "label": _node_label(r),
             "mark": marks.get(r.name), "frame_width": len(c) * CELL + 2}
            for i, (r, c) in enumerate(zip(shown, cells))]
    shown_models = {(c.org, c.model, Swatch(c.colour, c.pattern)) for row_cells in cells for c in row_cells if c.pod}
    legend = _legend_html(sorted(shown_models))
    pattern_defs = _pattern_defs({swatch for *_, swatch in shown_models})
    # Cordoned nodes, and who holds them: a defrag job that rests offers "return to service".
    newest = defrag_jobs_newest_by_node(cluster=cluster_row)
    cordoned = []
    for r in view.rows:
        if not r.cordoned:
            continue
        job = newest.get(r.name)
        cordoned.append({"row": r, "job": job, "returnable": job is not None and not defrag_job_holding_reason(job)})
    return render(request, "capacity/gpu_map.html", {
        "title": f"GPU map — {cluster_row.name}",
        "cluster": cluster_row, "pools": view.pools, "advice": view.advice, "rows": rows, "pool": pool,
        "legend": legend, "pattern_defs": pattern_defs, "page": page, **_data_age(read, now),
        "may_defrag": request.user.has_perm(START_PERMISSION), "may_return": request.user.has_perm(RETURN_PERMISSION),
        "candidates": view.candidates[:TOP_CANDIDATES], "candidates_total": len(view.candidates), "cordoned": cordoned,
        "svg_width": LABEL_WIDTH + width * CELL + (USED_WIDTH + CAMPAIGN_WIDTH if marks else 180),
        "svg_height": max(len(rows), 1) * (CELL + 6), "text_x": LABEL_WIDTH + width * CELL + 8,
        "mark_x": LABEL_WIDTH + width * CELL + USED_WIDTH, "frame_x": LABEL_WIDTH - 3, "frame_height": CELL + 4, "page_query": _page_query(pool, page.number), **campaign,
    })


def _page_query(pool: str | None, page: int) -> str:
    """The map's pool and page as a query string (the campaign toggle keeps them)."""
    return "&".join(part for part in (f"pool={quote(pool)}" if pool else "", f"page={page}" if page > 1 else "")
                    if part)


def _campaign_context(cluster_row, pool: str | None, now, *, marked: bool) -> dict:
    """The proposals of the pool shown (every pool's on the whole map) that free a node,
    and, with the toggle on, the marks drawn beside their nodes."""
    lines = [line for line in proposal_lines(proposals_latest(cluster=cluster_row), cluster=cluster_row.name, now=now,
                                             policies=campaign_policies(cluster=cluster_row))
             if pool is None or line.pool == pool]
    return {"campaigns": [{"line": line, "nodes": moves_by_node(line.plan)} for line in lines],
            "campaign_marked": marked, "marks": node_marks(lines, several_pools=len(lines) > 1) if marked else {}}


def _dashboard_campaigns(cluster_row, now) -> dict:
    """The proposals that free a node; whether the schedule has proposed for the cluster at
    all (before its first run the page says when proposals come, not nothing); its interval."""
    rows = proposals_latest(cluster=cluster_row)
    every = next(p.every_seconds for p in SCHEDULES if p.name == CAMPAIGN_PROPOSALS_SCHEDULE)
    return {"campaigns": proposal_lines(rows, cluster=cluster_row.name, now=now,
                                        policies=campaign_policies(cluster=cluster_row)),
            "campaigns_proposed": bool(rows), "campaign_schedule": CAMPAIGN_PROPOSALS_SCHEDULE,
            "campaign_every": seconds_text(every)}


@staff_member_required
def home(request):
    """The admin's "View site": the default cluster's dashboard (else the first cluster's, by
    name), or the admin's home page, which lists the clusters, when none is registered."""
    row = cluster_find(name=settings.DEFAULT_CLUSTER_NAME) or clusters_all().first()
    if row is None:
        return redirect("admin:index")
    return redirect("capacity:dashboard", cluster=row.name)


@cluster_contents_required
@collector_paused
def dashboard(request, cluster: str):
    cluster_row = cluster_find(name=cluster)
    if cluster_row is None:
        raise Http404(f"no cluster named {cluster!r}")
    context = {"cluster": cluster_row, "clusters": clusters_all(),
               "refresh_seconds": REFRESH_SECONDS, "title": f"Dashboard — {cluster_row.name}"}
    now = clock.now()
    try:
        read = gpu_summary_recent(cluster=cluster_row, now=now)
        context["gpus"] = read.value
        context.update(_data_age(read, now))
    except KubeError as exc:
        context["error"] = str(exc)
    orgs = org_counts(cluster=cluster_row, now=now)
    jobs = DefragJob.objects.filter(cluster=cluster_row).select_related("requested_by")
    context.update({
        "orgs_total": orgs["total"],
        "orgs_dormant": orgs["dormant"],
        "orgs_protected": orgs["protected"],
        "orgs_drifting": orgs["drifting"],
        # Who asked, as the job list names them (a user, or cli:<os user>@<host> for the CLI).
        "jobs_running": [(j, actor_describe(j.requested_by, j.requested_by_label))
                         for j in jobs.filter(state__in=RUNNING_STATES)],
        "jobs_recent": [(j, actor_describe(j.requested_by, j.requested_by_label))
                        for j in jobs.exclude(state__in=RUNNING_STATES)[:RECENT]],
        "prune_runs": prune_runs_recent(cluster=cluster_row, limit=RECENT),
        "may_dry_run": request.user.has_perm(DRY_RUN_PERMISSION),
        "prune_window_minutes": settings.PRUNER_DURATION_MINUTES, "prune_grace_seconds": settings.PRUNER_GRACE_SECONDS,
        **_dashboard_campaigns(cluster_row, now),
    })
    status = 502 if "error" in context else 200
    return render(request, "capacity/dashboard.html", context, status=status)
