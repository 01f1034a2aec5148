from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler"

    def ready(self) -> None:
        from django.db.models.signals import post_delete, post_save

        from scheduler import checks  # noqa: F401  (registers the system checks)
        from scheduler.models import Variant
        from scheduler.routing import variants_forget

        post_save.connect(variants_forget, sender=Variant, dispatch_uid="variants_forget_saved")
        post_delete.connect(variants_forget, sender=Variant, dispatch_uid="variants_forget_deleted")
