"""The inference worker's side of Redis, played by a test: read what was queued, publish events."""

from __future__ import annotations

import json
import time
from typing import Any

from scheduler import keys
from scheduler.redis import sync_redis


def queued(tier: str, variant: str = "stable") -> list[dict[str, Any]]:
    """The jobs waiting in a tier's queue: request_id plus the decoded payload."""
    entries = sync_redis().xrange(keys.queue(variant, tier))
    return [{"request_id": fields["request_id"], **json.loads(fields["payload"])} for _, fields in entries]


def wait_queued(tier: str, count: int = 1, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = queued(tier)
        if len(jobs) >= count:
            return jobs
        time.sleep(0.01)
    raise AssertionError(f"{count} job(s) were not queued in {tier} within {timeout_s}s")


def publish(request_id: str, *events: tuple[str, dict[str, Any]], variant: str = "stable") -> None:
    client = sync_redis()
    for kind, data in events:
        client.xadd(keys.result(variant, request_id), {"type": kind, "data": json.dumps(data)})


def tokens(*texts: str) -> list[tuple[str, dict[str, Any]]]:
    return [("token", {"seq": n, "text": text}) for n, text in enumerate(texts)]


def done(finish_reason: str = "stop", prompt_tokens: int = 7, completion_tokens: int = 3) -> tuple[str, dict]:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return ("done", {"finish_reason": finish_reason, "usage": usage, "timings": {}})


def answer(request_id: str, *texts: str, variant: str = "stable") -> None:
    """A whole answer: start, the tokens, done."""
    publish(
        request_id,
        ("start", {"attempt": 1}),
        *tokens(*texts),
        done(completion_tokens=len(texts)),
        variant=variant,
    )
