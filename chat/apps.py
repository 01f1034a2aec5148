from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from chat import checks  # noqa: F401  (registers the system checks)

        # The web's /metrics serves WEB_REGISTRY; the hand-off collector reads this app's models.
        from chat.metrics import HANDOFF_COLLECTOR
        from scheduler.metrics import WEB_REGISTRY

        WEB_REGISTRY.register(HANDOFF_COLLECTOR)
