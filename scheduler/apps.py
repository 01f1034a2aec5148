from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"

    def ready(self) -> None:
        from scheduler import checks  # noqa: F401  (registers the system checks)
