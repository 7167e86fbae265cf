from django.urls import path

from capacity import views

app_name = "capacity"
urlpatterns = [
    path("clusters/<slug:cluster>/gpu-map/", views.gpu_map, name="gpu_map"),
    path("defrag-jobs/<int:pk>/progress.json", views.job_progress, name="job_progress"),
]
