"""Small inline SVG sparklines of a pod's GPU utilization over a run's window."""
from __future__ import annotations

from django.utils.html import format_html

WIDTH, HEIGHT = 180, 36  # pixels


def sparkline(points: list[tuple[float, float]], *, start: float, end: float, threshold: float) -> str:
    """`points` are (unix time, utilization 0–1); the dashed line is the idle threshold."""
    if not points:
        return format_html('<span class="quiet">no data in the window</span>')
    span = max(end - start, 1.0)

    def xy(t: float, v: float) -> str:
        x = (t - start) / span * WIDTH
        y = HEIGHT - 2 - max(0.0, min(v, 1.0)) * (HEIGHT - 4)
        return f"{x:.1f},{y:.1f}"

    line = " ".join(xy(t, v) for t, v in points)
    # format_html escapes every argument into a SafeString first, so numbers are
    # formatted here: a format spec such as `{:.1f}` in the template would raise.
    ty = f"{HEIGHT - 2 - max(0.0, min(threshold, 1.0)) * (HEIGHT - 4):.1f}"
    peak = max(v for _, v in points)
    return format_html(
        '<svg class="prune-chart" width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="GPU utilization, max {}">'
        '<rect width="100%" height="100%" fill="#f6f6f6"/>'
        '<line x1="0" x2="{}" y1="{}" y2="{}" stroke="#c33" stroke-dasharray="3,2"/>'
        '<polyline fill="none" stroke="#36c" stroke-width="1.5" points="{}"/></svg>',
        WIDTH, HEIGHT, WIDTH, HEIGHT, f"{peak:.3f}", WIDTH, ty, ty, line)
