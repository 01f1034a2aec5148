"""How the worker waits on Redis and on its own tasks without ever being stuck when told to stop.

A running worker waits out a Redis restart; a stopping one gives up at a deadline (its drain
timeout plus HAND_BACK_S) and exits: what it could not hand back is taken over by another
worker after its lease, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis

logger = logging.getLogger(__name__)

REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError)
# How long a stopping worker waits for a cancelled task to end before it cancels it again.
CANCEL_AGAIN_S = 0.1

T = TypeVar("T")


class RedisGaveUp(Exception):
    """A stopping worker stopped waiting for Redis."""


class RedisRetry:
    """Runs a Redis operation until it succeeds; Redis restarts are waited out, except once
    `give_up_at` (loop time) is set by a stopping worker: then it raises RedisGaveUp."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.give_up_at: float | None = None

    async def __call__(self, operation: Callable[[], Awaitable[T]]) -> T:
        delay = 0.05
        loop = asyncio.get_running_loop()
        while True:
            try:
                if self.give_up_at is None:
                    return await operation()
                async with asyncio.timeout_at(self.give_up_at):
                    return await operation()
            except REDIS_ERRORS as exc:
                logger.warning("worker %s: redis unavailable (%s); retrying", self.worker_id, exc)
            except TimeoutError:
                if self.give_up_at is None:
                    raise
                raise RedisGaveUp from None
            if self.give_up_at is not None and loop.time() + delay >= self.give_up_at:
                raise RedisGaveUp
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def wait_for_cancelled(tasks: list[asyncio.Task], *, give_up_at: float | None) -> None:
    """Wait until the cancelled tasks have ended. A cancel can be lost: in tests, a stopping
    worker's heartbeat loop and its warm-pool loop each went on looping after their cancel, which
    a call under them had caught (which call, not found yet), and the worker waited for them for
    good. So a task still running CANCEL_AGAIN_S after its cancel is cancelled again (that can cut
    its cleanup short, such as an engine request's abort: the engine shuts down next anyway),
    until `give_up_at` (loop time; drain() sets it), when the worker stops waiting and names the
    tasks left. What a task raised, other than its cancel, is logged."""
    loop = asyncio.get_running_loop()
    pending = {task for task in tasks if not task.done()}
    recancelled: set[asyncio.Task] = set()
    while pending:
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)
        if pending and give_up_at is not None and loop.time() >= give_up_at:
            logger.error("stopping without waiting for %s", ", ".join(sorted(t.get_name() for t in pending)))
            return
        for task in pending:
            if task not in recancelled:
                logger.warning("task %s went on after its cancel; cancelling it again", task.get_name())
                recancelled.add(task)
            task.cancel()
    for task in tasks:
        error = None if task.cancelled() else task.exception()
        if error is not None and not isinstance(error, RedisGaveUp):
            logger.warning("task %s had failed: %r", task.get_name(), error)


async def wait_for(event: asyncio.Event, timeout_s: float) -> None:
    """Until the event is set or the timeout passes, whichever comes first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
