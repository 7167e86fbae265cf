"""The savings page of a cluster and its CSV export (staff with `capacity.view_cluster_contents`,
checked before any cluster call: the page names orgs, workloads and nodes)."""
from __future__ import annotations

import csv

from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

from clusters.selectors import cluster_find, clusters_all
from config import clock

from savings.planning import (MECHANISM_BASIS, MECHANISMS, UNKNOWN_MODEL, SavingsInputError, savings_plan,
                              window)
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


@cluster_contents_required
def savings_page(request, cluster: str):
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
        "prices": sorted(report.prices.items()), "day_choices": (7, 14, 30, 90)})


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
