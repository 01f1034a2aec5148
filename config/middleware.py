"""The answer when the database cannot take a request in time."""

from __future__ import annotations

import logging

from django.db import OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin

logger = logging.getLogger(__name__)

# A burst passes in seconds: the lock or the pooled connection that was busy is free by then.
DATABASE_BUSY_RETRY_AFTER_S = 2


class DatabaseBusyMiddleware(MiddlewareMixin):
    """A request that waited past the database's lock timeout (SQLite) or the connection pool's
    timeout (PostgreSQL) is refused with 503 and Retry-After, like any other overload, not
    answered 500: its transaction rolled back, so nothing of it stays behind and the client can
    simply send it again. The body fits both the chat's and the OpenAI API's error shapes."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError):
            return None
        logger.warning("database busy, refused %s %s: %s", request.method, request.path, exception)
        response = JsonResponse(
            {
                "error": {
                    "message": "The service is busy. Please try again in a moment.",
                    "type": "service_unavailable",
                    "param": None,
                    "code": "database_busy",
                }
            },
            status=503,
        )
        response["Retry-After"] = str(DATABASE_BUSY_RETRY_AFTER_S)
        return response
