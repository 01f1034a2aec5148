"""The console's Celery tasks: the canary's periodic evaluation (beat, every
CANARY_EVALUATION_S) and a variant's quality score (started from the canary page)."""

from functools import partial

from celery import shared_task
from django.db import transaction

from admin_console.services import canary as canary_services
from admin_console.services import quality as quality_services


@shared_task
def canary_evaluate() -> str:
    return canary_services.canary_evaluate()


@shared_task(ignore_result=True)
def quality_run(run_id: int) -> None:
    quality_services.quality_run_execute(run_id=run_id)


def quality_run_send(run_id: int) -> None:
    """Send the run's task once the transaction that recorded it commits. It goes to the batch
    jobs' queue (CELERY_TASK_ROUTES): its questions take minutes."""
    transaction.on_commit(partial(quality_run.delay, run_id))
