from django.urls import path

from pruning import views

app_name = "pruning"
urlpatterns = [
    path("clusters/<slug:cluster>/dry-run/", views.prune_dry_run, name="dry_run"),
]
