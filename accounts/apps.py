from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """The account model, signing in and the demo accounts."""

    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts import checks  # noqa: F401  (registers the system checks)
