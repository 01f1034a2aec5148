from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"

    def ready(self) -> None:
        from inference import checks  # noqa: F401  (registers the system checks)
