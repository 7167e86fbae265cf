"""Charts of a pod's GPU utilization over a run's window, drawn by the vendored Chart.js.

The server writes each chart's Chart.js config as JSON next to its canvas; the panel's
`savings/charts.js` draws every such canvas (and adds the UTC clock labels JSON cannot
carry). Axes are titled with their units; times are UTC."""
from __future__ import annotations

import itertools

from django.utils.html import format_html, json_script

CHART_JS = ("vendor/chartjs/chart.umd.min.js", "savings/charts.js")   # static paths, in load order
WIDTH, HEIGHT = 360, 150  # CSS pixels of one chart
_ids = itertools.count(1)


def utilization_chart_config(points: list[tuple[float, float]], *, start: float, end: float,
                             threshold: float, title: str = "") -> dict:
    """`points` are (unix time, utilization 0–1); shown in percent against UTC time, with the
    idle threshold as a dashed line."""
    def pct(v: float) -> float:
        return round(max(0.0, min(v, 1.0)) * 100, 2)

    line = [{"x": round(t * 1000), "y": pct(v)} for t, v in points]
    limit = [{"x": round(start * 1000), "y": pct(threshold)}, {"x": round(end * 1000), "y": pct(threshold)}]
    return {
        "type": "line",
        "data": {"datasets": [
            {"label": "GPU utilization (%)", "data": line, "borderColor": "#3366cc", "borderWidth": 1.5,
             "pointRadius": 0, "fill": False},
            {"label": "idle threshold (%)", "data": limit, "borderColor": "#cc3333", "borderDash": [4, 3],
             "borderWidth": 1, "pointRadius": 0, "fill": False},
        ]},
        "options": {
            "responsive": True, "maintainAspectRatio": False, "animation": False, "parsing": True,
            "plugins": {"legend": {"display": False},
                        "title": {"display": bool(title), "text": title}},
            "scales": {
                "x": {"type": "linear", "utcTime": True, "min": round(start * 1000), "max": round(end * 1000),
                      "title": {"display": True, "text": "time (UTC)"}, "ticks": {"maxTicksLimit": 6}},
                "y": {"min": 0, "max": 100, "title": {"display": True, "text": "GPU utilization (%)"},
                      "ticks": {"stepSize": 25}},
            },
        },
    }


def sparkline(points: list[tuple[float, float]], *, start: float, end: float, threshold: float) -> str:
    """A canvas and its config; the page must also load `CHART_JS` (the admin's Media does)."""
    if not points:
        return format_html('<span class="quiet">no data in the window</span>')
    chart_id = f"prune-chart-{next(_ids)}"
    config = utilization_chart_config(points, start=start, end=end, threshold=threshold)
    peak = max(v for _, v in points)
    return format_html(
        '<div class="prune-chart" style="position:relative;width:{}px;height:{}px">'
        '<canvas data-chart="{}" role="img" aria-label="GPU utilization over the window, max {}%"></canvas></div>{}',
        WIDTH, HEIGHT, chart_id, f"{peak * 100:.1f}", json_script(config, chart_id))

