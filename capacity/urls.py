from django.urls import path

from capacity.defrag import views as defrag_views
from capacity.gpumap import views as gpumap_views

app_name = "capacity"
urlpatterns = [
    path("", gpumap_views.home, name="home"),
    path("clusters/<slug:cluster>/", gpumap_views.dashboard, name="dashboard"),
    path("clusters/<slug:cluster>/gpu-map/", gpumap_views.gpu_map, name="gpu_map"),
    path("defrag-jobs/<int:pk>/progress.json", defrag_views.job_progress, name="job_progress"),
]
