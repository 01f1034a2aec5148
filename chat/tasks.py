"""Chat's Celery tasks: periodic housekeeping, run by beat."""

from celery import shared_task
from django.conf import settings

from chat import services


@shared_task
def purge_guest_conversations() -> int:
    return services.guest_conversations_purge(older_than_days=settings.GUEST_RETENTION_DAYS)


@shared_task
def purge_expired_sessions() -> int:
    return services.sessions_expired_purge()
