"""`{% clusters_panel %}`: the clusters box on the admin home page."""
from __future__ import annotations

from django import template

from clusters.selectors import clusters_all

register = template.Library()


@register.inclusion_tag("capacity/clusters_panel.html", takes_context=True)
def clusters_panel(context):
    # Only those who may open the dashboard and GPU map are offered links to them.
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.has_perm("capacity.view_cluster_contents"):
        return {"clusters": [], "hidden": True}
    return {"clusters": list(clusters_all())}
