from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AdminConsoleConfig(AppConfig):
    name = "admin_console"

    def ready(self) -> None:
        # The web's /metrics serves WEB_REGISTRY; the rollbacks collector reads this app's models.
        from admin_console.metrics import CanaryRollbacksCollector
        from scheduler.metrics import WEB_REGISTRY

        WEB_REGISTRY.register(CanaryRollbacksCollector())
        # After Django has made the permissions (its own post_migrate handler runs first).
        post_migrate.connect(_console_administrators_ensure, sender=self)


def _console_administrators_ensure(*, apps: Any = None, **kwargs: Any) -> None:
    """The group with every console power exists (a flushed test database loses it). With the
    models of the migration state `migrate` reached, as Django's own handlers do."""
    from django.apps import apps as installed

    from admin_console.models import CONSOLE_ADMINISTRATORS, CONSOLE_POWERS

    models = apps or installed
    try:
        group_model = models.get_model("auth", "Group")
        permission_model = models.get_model("auth", "Permission")
    except LookupError:
        return
    group, _ = group_model.objects.get_or_create(name=CONSOLE_ADMINISTRATORS)
    group.permissions.add(
        *permission_model.objects.filter(content_type__app_label="admin_console", codename__in=CONSOLE_POWERS)
    )
