from django.contrib import admin
from django.urls import include, path

# The admin home page starts with the clusters box (dashboard and GPU map links).
admin.site.index_template = "admin/gpu_index.html"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("capacity/", include("capacity.urls")),
    path("api/orgs/", include("orgs.urls")),
]
