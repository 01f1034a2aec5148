from django.apps import AppConfig


class AdminConsoleConfig(AppConfig):
    name = "admin_console"

    def ready(self) -> None:
        # The web's /metrics serves WEB_REGISTRY; the rollbacks collector reads this app's models.
        from admin_console.metrics import CanaryRollbacksCollector
        from scheduler.metrics import WEB_REGISTRY

        WEB_REGISTRY.register(CanaryRollbacksCollector())
