"""The warm pool: workers that have loaded their engine and heartbeat, but claim nothing while
the model's serving workers already cover `llm_workers_desired`; when the count rises, a spare
starts claiming at its next heartbeat instead of the minutes a cold engine start takes.

The console sets how many spares each model keeps (WarmPool, mirrored into Redis, read at
most once a second). With none, every worker serves, as without a pool. Which workers serve is
decided in Redis, one worker at a time, so two spares never both join for one missing worker.
"""

from __future__ import annotations

import time

import redis
import redis.asyncio as aioredis
from django.conf import settings

from scheduler import keys
from scheduler.autoscale import workers_desired
from scheduler.models import WarmPool
from scheduler.queues import queue_state
from scheduler.redis import async_script, sync_redis
from scheduler.workers import live_workers

CACHE_S = 1.0

# KEYS[1] the model's serving set. ARGV: worker id, now, drop members last seen before this,
# workers needed (-1: every worker serves), the set's lifetime (ms). Returns 1 if the worker
# serves. A serving worker stays while the others do not cover the need; a spare joins while
# they fall short.
SERVE_OR_SPARE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[3])
local needed = tonumber(ARGV[4])
local serving = redis.call('ZSCORE', KEYS[1], ARGV[1])
local others = redis.call('ZCARD', KEYS[1])
if serving then others = others - 1 end
if needed >= 0 and others >= needed then
    if serving then redis.call('ZREM', KEYS[1], ARGV[1]) end
    return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""

_cache: list[tuple[float, int]] = []


def spares_mirror() -> int:
    """Write the pool's size from the database into Redis; returns it."""
    spares = WarmPool.load().spares
    sync_redis().set(keys.WARM_SPARES, spares)
    _cache.clear()
    return spares


def warm_spares() -> int:
    """Spares per model: from the mirror, rebuilt from the database when Redis lost it."""
    if _cache and time.monotonic() - _cache[0][0] < CACHE_S:
        return _cache[0][1]
    try:
        value = sync_redis().get(keys.WARM_SPARES)
        spares = int(value) if value is not None else spares_mirror()
    except (redis.ConnectionError, redis.TimeoutError):
        spares = WarmPool.load().spares
    _cache[:] = [(time.monotonic(), spares)]
    return spares


def serving_needed(*, model: str) -> int | None:
    """How many of the model's workers should claim now; None while the pool is off. At least
    one serves, so the first request after a quiet spell does not wait for the count to rise."""
    if warm_spares() == 0:
        return None
    queued = {tier: queue_state(model=model, tier=tier).queued for tier in keys.TIERS}
    return max(1, workers_desired(model=model, workers=live_workers(), queued=queued))


async def serving_decide(client: aioredis.Redis, *, model: str, worker_id: str, needed: int | None) -> bool:
    """Whether this worker claims until its next heartbeat (True) or waits as a spare."""
    now = time.time()
    ttl_s = settings.WORKER_HEARTBEAT_TTL_S
    serves = await async_script(client, SERVE_OR_SPARE)(
        keys=[keys.serving(model)],
        args=[worker_id, now, now - ttl_s, -1 if needed is None else needed, int(ttl_s * 1000)],
    )
    return bool(serves)


async def serving_count(client: aioredis.Redis, *, model: str) -> int:
    """How many workers claim the model's jobs (their heartbeats fresh)."""
    return await client.zcount(keys.serving(model), time.time() - settings.WORKER_HEARTBEAT_TTL_S, "+inf")


async def serving_leave(client: aioredis.Redis, *, model: str, worker_id: str) -> None:
    """A draining or stopping worker no longer covers the need: a spare may take its place."""
    await client.zrem(keys.serving(model), worker_id)
