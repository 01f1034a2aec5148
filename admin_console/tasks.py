"""The canary's periodic evaluation, run by Celery beat every CANARY_EVALUATION_S."""

from celery import shared_task

from admin_console import services


@shared_task
def canary_evaluate() -> str:
    return services.canary_evaluate()
