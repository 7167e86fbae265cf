from django.apps import AppConfig


class PruningConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "pruning"
    verbose_name = "Idle-GPU pruner"
