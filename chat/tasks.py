"""Chat's Celery tasks: periodic housekeeping (run by beat) and feeding batch jobs."""

import threading
from uuid import UUID

from celery import shared_task
from celery.signals import worker_shutting_down
from django.conf import settings

from chat import jobs, services

# Set when this worker begins a warm shutdown: a job task then hands its job on at once
# instead of finishing its slice (threads and solo pools; prefork children end with the slice).
_worker_stopping = threading.Event()


@worker_shutting_down.connect
def _note_worker_stopping(**kwargs: object) -> None:
    _worker_stopping.set()


@shared_task
def purge_guest_conversations() -> int:
    return services.guest_conversations_purge(older_than_days=settings.GUEST_RETENTION_DAYS)


@shared_task
def purge_expired_sessions() -> int:
    return services.sessions_expired_purge()


@shared_task(ignore_result=True)
def job_run(job_id: str) -> None:
    """Feed a batch job for one slice; while it is unfinished, a fresh task takes the next."""
    if jobs.job_feed(
        job_id=UUID(job_id), budget_s=settings.BATCH_JOB_SLICE_S, stop_requested=_worker_stopping.is_set
    ):
        job_run.delay(job_id)


@shared_task(ignore_result=True)
def jobs_resume() -> int:
    """Restart the jobs whose task died (its lease ran out) or never started."""
    stalled = jobs.job_ids_stalled()
    for job_id in stalled:
        job_run.delay(str(job_id))
    return len(stalled)
