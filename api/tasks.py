"""The API's Celery tasks: feeding batch jobs, and restarting those whose task died."""

import threading
from functools import partial
from uuid import UUID

from celery import shared_task
from celery.signals import worker_shutting_down
from django.conf import settings
from django.db import transaction

from api import jobs

# Set when this worker begins a warm shutdown: a job task then hands its job on at once
# instead of finishing its slice (threads and solo pools; prefork children end with the slice).
_worker_stopping = threading.Event()


@worker_shutting_down.connect
def _note_worker_stopping(**kwargs: object) -> None:
    _worker_stopping.set()


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


def job_start(job_id: UUID) -> None:
    """Send the first task of a new job once the transaction that made it commits. It goes to
    the batch jobs' own queue (CELERY_TASK_ROUTES), which its own worker consumes."""
    transaction.on_commit(partial(job_run.delay, str(job_id)))
