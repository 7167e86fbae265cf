"""`{% clusters_panel %}`: the clusters box on the admin home page."""
from __future__ import annotations

from django import template

from clusters.models import Cluster

register = template.Library()


@register.inclusion_tag("capacity/clusters_panel.html")
def clusters_panel():
    return {"clusters": list(Cluster.objects.order_by("name"))}
