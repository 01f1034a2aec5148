"""Periodic chat housekeeping, run by Celery beat."""

from celery import shared_task
from django.conf import settings

from chat import services


@shared_task
def purge_guest_conversations() -> int:
    return services.guest_conversations_purge(older_than_days=settings.GUEST_RETENTION_DAYS)
