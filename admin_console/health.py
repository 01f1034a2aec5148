"""Liveness and readiness probes for load balancers and orchestrators."""

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from scheduler.redis import sync_redis
from scheduler.workers import live_workers


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    try:
        sync_redis().ping()
        checks["redis"] = "ok"
        workers = live_workers()
        checks["workers"] = f"{len(workers)} live" if workers else "none live"
    except Exception as exc:
        checks["redis"] = f"error: {exc.__class__.__name__}"
        workers = []
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {exc.__class__.__name__}"
    ready = checks["redis"] == "ok" and checks["database"] == "ok" and bool(workers)
    return JsonResponse({"ready": ready, "checks": checks}, status=200 if ready else 503)
