"""`python -m bench post`: what one chat post costs the web process, guest and signed in.

In this process, like retrieval and cache: a private SQLite database and redis-server, the
demo accounts, and Django's test client sending each post through the whole middleware stack
and view, as a browser's form would (CSRF token, session or guest cookie). Each post starts a
new conversation, as the overhead scenario's do, with the same settings (no limits in the way,
the result cache off). A post ends when its job is queued, so no worker runs: the jobs wait in
the queue. Per post it times the request and counts the SQL statements (those Django sends
through a cursor: BEGIN counts, COMMIT does not) and the Redis round trips it made.
`--profile` also writes a cProfile of the signed-in posts, whose times then include the
profiler's.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from pathlib import Path
from typing import Any

from bench.stats import percentile


class _Counts:
    """SQL statements and Redis round trips made since the last `take`."""

    def __init__(self) -> None:
        self.sql = 0
        self.redis = 0

    def take(self) -> tuple[int, int]:
        counts = (self.sql, self.redis)
        self.sql = self.redis = 0
        return counts

    def statement(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.sql += 1
        return execute(sql, params, many, context)


@contextmanager
def _counting(counts: _Counts) -> Iterator[None]:
    """Count every statement on the database connections opened meanwhile, and every write of a
    command (or a pipeline) to a Redis connection: one round trip each."""
    from django.db import connections
    from django.db.backends.signals import connection_created
    from redis.connection import AbstractConnection

    def connected(sender: Any, connection: Any, **kwargs: Any) -> None:
        if counts.statement not in connection.execute_wrappers:
            connection.execute_wrappers.append(counts.statement)

    send = AbstractConnection.send_packed_command

    def send_counted(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        counts.redis += 1
        send(self, command, check_health)

    connections.close_all()  # every post opens its connection, as a served request does
    connection_created.connect(connected)
    AbstractConnection.send_packed_command = send_counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
        connection_created.disconnect(connected)
        for connection in connections.all():
            if counts.statement in connection.execute_wrappers:
                connection.execute_wrappers.remove(counts.statement)


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50) or 0, 2),
        "p99": round(percentile(values, 99) or 0, 2),
        "max": round(max(values), 2),
    }


def post(*, posts: int, profile_to: Path | None = None) -> dict:
    from bench.stack import UNLIMITED
    from launcher.redis import RedisServer

    with tempfile.TemporaryDirectory(prefix="bench-post-") as workdir:
        redis_server = RedisServer(Path(workdir) / "redis")
        redis_server.start()
        try:
            os.environ.update(
                {
                    **UNLIMITED,
                    "DATABASE_URL": f"sqlite:///{Path(workdir) / 'bench.sqlite3'}",
                    "REDIS_URL": redis_server.url,
                    "INFERENCE_ENGINE": "simulated",
                }
            )
            return _run(posts=posts, profile_to=profile_to)
        finally:
            redis_server.stop()


def _run(*, posts: int, profile_to: Path | None) -> dict:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import close_old_connections
    from django.test import Client
    from django.urls import reverse

    from accounts.models import User
    from bench.stack import question
    from chat.services import conversation_id_offer

    call_command("migrate", "--no-input", verbosity=0)
    call_command("seed_demo", "--staff-password=bench-only-staff-password", stdout=StringIO())
    counts = _Counts()
    report: dict[str, Any] = {"posts": posts}
    for kind in ("guest", "signed_in"):
        client = Client(enforce_csrf_checks=True, HTTP_HOST="localhost")
        if kind == "signed_in":
            client.force_login(User.objects.get(username="alice"))
        client.get(reverse("chat:home"))  # the page gives the CSRF and guest cookies
        headers = {"X-CSRFToken": client.cookies["csrftoken"].value, "Accept": "application/json"}
        profiler = cProfile.Profile() if profile_to is not None and kind == "signed_in" else None
        times_ms: list[float] = []
        sql: list[int] = []
        redis_calls: list[int] = []
        with _counting(counts):
            for n in range(posts + 1):
                url = reverse("chat:message_post", args=[conversation_id_offer()])
                counts.take()
                started = time.perf_counter()
                if profiler is not None and n > 0:
                    profiler.enable()
                response = client.post(url, {"text": question(n)}, headers=headers)
                if profiler is not None:
                    profiler.disable()
                elapsed_ms = (time.perf_counter() - started) * 1000
                # The test client keeps the database connection across requests; a served
                # request closes it (CONN_MAX_AGE 0), so the next post opens one as it would.
                close_old_connections()
                statements, round_trips = counts.take()
                if response.status_code != 202:
                    raise RuntimeError(f"post {n} ({kind}): {response.status_code} {response.content!r}")
                if n == 0:
                    continue  # the first one warms what a process loads once (scripts, the embedder)
                times_ms.append(elapsed_ms)
                sql.append(statements)
                redis_calls.append(round_trips)
        report[kind] = {
            "post_ms": _ms(times_ms),
            "sql_statements": {"min": min(sql), "max": max(sql), "mean": sum(sql) / len(sql)},
            "redis_round_trips": {
                "min": min(redis_calls),
                "max": max(redis_calls),
                "mean": sum(redis_calls) / len(redis_calls),
            },
        }
        if profiler is not None and profile_to is not None:
            profiler.dump_stats(profile_to)
            report["profile"] = str(profile_to)
    return report


def profile_summary(path: Path, *, lines: int = 30) -> None:
    """Print the functions that took most of the profiled posts' time, cumulatively."""
    pstats.Stats(str(path)).sort_stats("cumulative").print_stats(lines)
