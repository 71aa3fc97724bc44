from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Muster console"

    def ready(self) -> None:
        from console import taskstats  # noqa: F401 - connects the Celery signal handlers
