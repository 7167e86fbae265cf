from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = "capacity"
    verbose_name = "Capacity: defrag jobs and the GPU map"
    default_auto_field = "django.db.models.BigAutoField"
