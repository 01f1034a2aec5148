"""Messages every worker must hear (cancel, drain), over Redis pub/sub.

A cancel is also written as a key, so a job that is still queued when the cancel is sent is
skipped when a worker claims it, even by a worker that was not listening at the time.
"""

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import redis
import redis.asyncio as aioredis

from scheduler import keys
from scheduler.redis import sync_redis

logger = logging.getLogger(__name__)

CANCEL_TTL_S = 3600


def request_cancel(*, request_id: str) -> None:
    client = sync_redis()
    with client.pipeline(transaction=False) as pipe:
        pipe.set(keys.cancel(request_id), 1, ex=CANCEL_TTL_S)
        pipe.publish(keys.CONTROL_CHANNEL, json.dumps({"type": "cancel", "request_id": request_id}))
        pipe.execute()


def worker_drain(*, worker_id: str) -> None:
    sync_redis().publish(keys.CONTROL_CHANNEL, json.dumps({"type": "drain", "worker_id": worker_id}))


async def cancelled_request_ids(client: aioredis.Redis, request_ids: list[str]) -> set[str]:
    if not request_ids:
        return set()
    flags = await client.mget([keys.cancel(rid) for rid in request_ids])
    return {rid for rid, flag in zip(request_ids, flags, strict=True) if flag}


async def control_messages(client: aioredis.Redis) -> AsyncIterator[dict[str, Any]]:
    """Yield control messages forever, resubscribing after a Redis restart."""
    while True:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(keys.CONTROL_CHANNEL)
            async for message in pubsub.listen():
                yield json.loads(message["data"])
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            logger.warning("control channel lost (%s); resubscribing", exc)
            await asyncio.sleep(0.5)
        finally:
            await pubsub.aclose()
