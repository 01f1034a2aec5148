from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Signing in and the demo accounts. The account model itself, `User`, is still
    `chat.User`: AUTH_USER_MODEL is referenced by the first migration of Django's admin, and an
    existing database would refuse to migrate once that pointed at an app whose migrations it
    has never applied."""

    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"
