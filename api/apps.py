from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    verbose_name = "API"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from api import checks  # noqa: F401  (registers the system checks)

        # The web's /metrics serves WEB_REGISTRY; the usage collector reads this app's models.
        from api.metrics import ApiKeyUsageCollector
        from scheduler.metrics import WEB_REGISTRY

        WEB_REGISTRY.register(ApiKeyUsageCollector())
