from django.apps import AppConfig


class OrgsConfig(AppConfig):
    name = "orgs"
    verbose_name = "Orgs and scale to zero"

    def ready(self) -> None:
        from orgs import signals  # noqa: F401  (connects the warmup receiver)
