from django.contrib import admin
from django.urls import include, path

from config.health import healthz, readyz
from config.observability import metrics_view

# The admin home page starts with the clusters box (dashboard and GPU map links).
admin.site.index_template = "admin/gpu_index.html"
# The product's name in the header, the browser tab and the home page (not "Django administration").
admin.site.site_header = admin.site.site_title = admin.site.index_title = "GPU capacity"
# "View site" leads to the default cluster's dashboard (capacity.gpumap.views.home); "/" is no page.
admin.site.site_url = "/capacity/"

urlpatterns = [
    path("admin/", admin.site.urls),
    # django-admin-interface's language chooser posts here (Django's set_language view).
    path("i18n/", include("django.conf.urls.i18n")),
    # Also answered first by config.health.ProbeMiddleware (before Host checks and redirects).
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path("capacity/", include("capacity.urls")),
    path("savings/", include("savings.urls")),
    path("pruning/", include("pruning.urls")),
    path("api/orgs/", include("orgs.urls")),
]
