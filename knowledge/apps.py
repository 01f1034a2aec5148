from django.apps import AppConfig


class KnowledgeConfig(AppConfig):
    name = "knowledge"
    verbose_name = "Help center"

    def ready(self) -> None:
        from knowledge import checks  # noqa: F401  (registers the system checks)
