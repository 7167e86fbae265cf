"""The savings page of a cluster and its CSV export (staff with `capacity.view_cluster_contents`,
checked before any cluster call: the page names orgs, workloads and nodes)."""
from __future__ import annotations

import csv

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

from clusters.errors import PrometheusError
from clusters.selectors import cluster_find, clusters_all
from config import clock
from pruning.services import prometheus_for

from savings.planning import (MECHANISM_BASIS, MECHANISMS, UNKNOWN_MODEL, SavingsInputError, savings_plan,
                              window)
from savings.history.planning import LABELS, SERIES, STYLE, WINDOWS, HistoryInputError, window_choose
from savings.history.selectors import gpu_history
from savings.selectors import savings_facts

CLUSTER_CONTENTS_PERMISSION = "capacity.view_cluster_contents"
DEFAULT_DAYS = 14


def cluster_contents_required(view):
    """Anonymous → the login page; staff without the permission → 403, before the view runs."""
    return staff_member_required(permission_required(CLUSTER_CONTENTS_PERMISSION, raise_exception=True)(view))


def _report(request, cluster: str):
    """The cluster row and its report, or an error response (unknown cluster, bad `days`)."""
    row = cluster_find(name=cluster, retired=True)   # a retired cluster's savings stay readable
    if row is None:
        raise Http404(f"no cluster named {cluster!r}")
    now = clock.now()
    days = request.GET.get("days", DEFAULT_DAYS)
    try:
        since, _ = window(now=now, days=days)
    except SavingsInputError as exc:
        return row, None, HttpResponseBadRequest(f"{exc}\n", content_type="text/plain; charset=utf-8")
    return row, savings_plan(savings_facts(cluster=row, now=now, since=since), now=now, days=days), None


def _history(row, *, window, now) -> dict:
    """The GPU history beside the savings, or the sentence saying why there is none (no
    Prometheus for the cluster, or no answer from it): the savings are shown either way."""
    if not (row.prometheus_url or settings.PROMETHEUS_URL):
        return {"message": f"No Prometheus is configured for cluster {row.name} (its Prometheus URL in Admin → "
                           "Clusters, or PROMETHEUS_URL): GPUs allocated, used and idle over time cannot be shown."}
    try:
        history = gpu_history(prometheus=prometheus_for(cluster=row), cluster=row.name, window=window, now=now,
                              idle_threshold=settings.PRUNER_IDLE_THRESHOLD)
    except (PrometheusError, HistoryInputError) as exc:
        return {"message": f"GPUs allocated, used and idle over time cannot be shown: {exc}"}
    pools = []
    for i, pool in enumerate(history.pools, start=1):
        pools.append({"pool": pool.pool, "chart_id": f"gpu-history-{i}", "gaps": pool.gaps,
                      "config": pool.chart_config(start=history.start, end=history.end, window=window.name),
                      "lines": [{"name": line, "label": LABELS[line], "colour": STYLE[line]["colour"],
                                 "average": pool.average(line), "steps": pool.steps_with_data(line)}
                                for line in SERIES]})
    return {"history": history, "pools": pools, "points": window.points}


@cluster_contents_required
def savings_page(request, cluster: str):
    try:   # before any read: a bad window is refused as it is, not after the cluster was read
        history_window = window_choose(request.GET.get("window"))
    except HistoryInputError as exc:
        return HttpResponseBadRequest(f"{exc}\n", content_type="text/plain; charset=utf-8")
    row, report, error = _report(request, cluster)
    if error is not None:
        return error
    figures = report.shown()
    per_org = [{"org": org, "cells": [hours[m] for m in MECHANISMS], "total": sum(hours.values()),
                "money": sum(figures.money_by_org[org].values()),
                "unpriced": sum(figures.unpriced_by_org[org].values())}
               for org, hours in figures.by_org.items()]
    per_day = [{"day": d, "hours": sum(figures.by_day[d].values()), "money": sum(figures.money_by_day[d].values()),
                "unpriced": sum(figures.unpriced_by_day[d].values())} for d in report.days]
    mechanisms = [{"name": m, "hours": figures.totals[m], "money": figures.money_totals[m],
                   "unpriced": figures.unpriced_totals[m],
                   "basis": MECHANISM_BASIS[m]} for m in MECHANISMS]
    return render(request, "savings/savings.html", {
        "title": f"Savings — {row.name}", "cluster": row, "clusters": clusters_all(),
        "report": report, "days": len(report.days), "mechanisms": mechanisms, "mechanism_names": MECHANISMS,
        "per_org": per_org, "per_day": per_day, "total": figures.total, "chart": report.chart_config(),
        "money_total": figures.money_total, "unpriced_total": sum(figures.unpriced_totals.values()), "currency": settings.SAVINGS_CURRENCY, "figures": figures,
        "prices": sorted(report.prices.items()), "day_choices": (7, 14, 30, 90),
        "window": history_window.name, "window_choices": list(WINDOWS),
        "gpu_history": _history(row, window=history_window, now=clock.now()),
        "idle_threshold_percent": f"{settings.PRUNER_IDLE_THRESHOLD * 100:g}"})


@cluster_contents_required
def savings_csv(request, cluster: str):
    row, report, error = _report(request, cluster)
    if error is not None:
        return error
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    first, last = report.days[0].isoformat(), report.days[-1].isoformat()
    response["Content-Disposition"] = f'attachment; filename="savings-{row.name}-{first}-to-{last}.csv"'
    writer = csv.writer(response)
    writer.writerow(["day_utc", "org", "mechanism", "gpu_model", "gpu_hours", "money", "currency", "money_note"])
    # The rows as the page rounds them: they add up to its totals. A row without money says
    # why in money_note and leaves money empty (never 0).
    figures = report.shown()
    for (r, hours), money in zip(figures.rows, figures.row_money):
        model = r.gpu_model if r.gpu_model != UNKNOWN_MODEL else "unknown"
        note = "" if money is not None else ("GPU model unknown" if r.gpu_model == UNKNOWN_MODEL else "no price")
        writer.writerow([r.day.isoformat(), r.org, r.mechanism, model, f"{hours}",
                         "" if money is None else f"{money}", settings.SAVINGS_CURRENCY, note])
    return response
