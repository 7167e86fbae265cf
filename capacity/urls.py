from django.urls import path

from capacity import views, views_dashboard

app_name = "capacity"
urlpatterns = [
    path("clusters/<slug:cluster>/", views_dashboard.dashboard, name="dashboard"),
    path("clusters/<slug:cluster>/gpu-map/", views.gpu_map, name="gpu_map"),
    path("defrag-jobs/<int:pk>/progress.json", views.job_progress, name="job_progress"),
]
