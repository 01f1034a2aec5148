"""The registry of live inference workers: each writes a heartbeat; readers see who is alive."""

import json
import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings

from scheduler import keys
from scheduler.redis import sync_redis


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    worker_id: str
    model: str
    engine: str
    slots: int
    running: int
    state: dict[str, Any]  # everything else the worker reported (engine stats, draining...)
    last_seen: float


async def heartbeat_write(
    client: aioredis.Redis,
    *,
    worker_id: str,
    info: dict[str, Any],
    jobs_per_s: float,
    normal_jobs_per_s: float,
) -> None:
    """Say this worker is alive, what it runs, and how many jobs a second it can finish
    (all tiers, and normal traffic alone): the queues' wait predictions add these up."""
    now = time.time()
    async with client.pipeline(transaction=False) as pipe:
        pipe.hset(keys.capacity(info["model"]), worker_id, f"{jobs_per_s}|{normal_jobs_per_s}|{now}")
        pipe.set(
            keys.worker_heartbeat(worker_id),
            json.dumps({**info, "worker_id": worker_id, "last_seen": now}),
            px=int(settings.WORKER_HEARTBEAT_TTL_S * 1000),
        )
        pipe.zadd(keys.WORKERS_INDEX, {worker_id: now})
        pipe.zremrangebyscore(keys.WORKERS_INDEX, "-inf", now - 3600)
        await pipe.execute()


async def heartbeat_remove(client: aioredis.Redis, *, worker_id: str, model: str) -> None:
    async with client.pipeline(transaction=False) as pipe:
        pipe.hdel(keys.capacity(model), worker_id)
        pipe.zrem(keys.serving(model), worker_id)
        pipe.delete(keys.worker_heartbeat(worker_id))
        pipe.zrem(keys.WORKERS_INDEX, worker_id)
        await pipe.execute()


def live_workers() -> list[WorkerInfo]:
    client = sync_redis()
    since = time.time() - settings.WORKER_HEARTBEAT_TTL_S
    worker_ids = client.zrangebyscore(keys.WORKERS_INDEX, since, "+inf")
    if not worker_ids:
        return []
    workers = []
    for raw in client.mget([keys.worker_heartbeat(w) for w in worker_ids]):
        if raw is None:
            continue
        info = json.loads(raw)
        workers.append(
            WorkerInfo(
                worker_id=info.pop("worker_id"),
                model=info.pop("model"),
                engine=info.pop("engine"),
                slots=info.pop("slots"),
                running=info.pop("running"),
                last_seen=info.pop("last_seen"),
                state=info,
            )
        )
    return sorted(workers, key=lambda w: w.worker_id)
