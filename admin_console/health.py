"""Liveness and readiness probes for load balancers and orchestrators.

They are public, so they say ready or not and nothing else: how many workers live is in
/metrics and the console, and what failed goes to the log.
"""

import logging

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from scheduler.redis import sync_redis
from scheduler.workers import live_workers

logger = logging.getLogger(__name__)


@require_GET
async def healthz(request: HttpRequest) -> JsonResponse:
    # Async, so it never waits behind a burst's sync views: alive is not the same as idle.
    return JsonResponse({"status": "ok"})


def _serving() -> bool:
    """Redis answers and at least one inference worker is alive."""
    try:
        sync_redis().ping()
        if live_workers():
            return True
        logger.warning("not ready: no live inference worker")
    except Exception:
        logger.warning("not ready: Redis check failed", exc_info=True)
    return False


def _database_ready() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:
        logger.warning("not ready: database check failed", exc_info=True)
        return False


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    ready = _serving() & _database_ready()  # both checks run, so the log names every failure
    return JsonResponse({"status": "ready" if ready else "not ready"}, status=200 if ready else 503)
