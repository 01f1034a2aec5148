import asyncio

import pytest

from scheduler import keys, workers
from scheduler.models import WarmPool
from scheduler.queues import job_enqueue
from scheduler.redis import new_async_redis, sync_redis
from scheduler.warmpool import serving_decide, serving_leave, serving_needed, spares_mirror, warm_spares
from tests.generation_jobs import MODEL, generation_job

pytestmark = pytest.mark.django_db


def _decide(needed: int | None, *worker_ids: str) -> dict[str, bool]:
    """Each worker decides once, all at the same time, each on its own connection."""

    async def decide_all() -> list[bool]:
        clients = [new_async_redis() for _ in worker_ids]
        try:
            return await asyncio.gather(
                *(
                    serving_decide(client, model=MODEL, worker_id=worker_id, needed=needed)
                    for client, worker_id in zip(clients, worker_ids, strict=True)
                )
            )
        finally:
            for client in clients:
                await client.aclose()

    return dict(zip(worker_ids, asyncio.run(decide_all()), strict=True))


def _serving() -> set[str]:
    return set(sync_redis().zrange(keys.serving(MODEL), 0, -1))


def test_without_a_pool_every_worker_serves():
    assert _decide(None, "w1", "w2", "w3") == {"w1": True, "w2": True, "w3": True}


def test_workers_beyond_the_need_wait_as_spares_and_one_joins_per_missing_worker():
    first = _decide(1, "w1", "w2", "w3")
    assert sum(first.values()) == 1
    server = next(w for w, serves in first.items() if serves)
    # Deciding again changes nothing while the need stays.
    assert _decide(1, *first) == first
    # One more worker needed: exactly one spare joins, though both asked at once.
    spares = [w for w, serves in first.items() if not serves]
    joined = _decide(2, *spares)
    assert sum(joined.values()) == 1
    assert _serving() == {server, *(w for w, serves in joined.items() if serves)}


def test_when_the_need_falls_one_serving_worker_returns_to_the_pool():
    _decide(3, "w1", "w2", "w3")
    assert _serving() == {"w1", "w2", "w3"}
    assert sum(_decide(2, "w1", "w2", "w3").values()) == 2
    assert len(_serving()) == 2


def test_a_stopping_worker_leaves_its_place_to_a_spare():
    _decide(1, "w1")
    assert _decide(1, "w2") == {"w2": False}

    async def stop() -> None:
        client = new_async_redis()
        try:
            await serving_leave(client, model=MODEL, worker_id="w1")
        finally:
            await client.aclose()

    asyncio.run(stop())
    assert _decide(1, "w2") == {"w2": True}


def test_the_need_is_the_desired_count_and_at_least_one_while_the_pool_is_on(settings, tier_policies):
    settings.AUTOSCALE_TARGET_UTILIZATION = 1.0
    settings.AUTOSCALE_ARRIVAL_WINDOW_S = 30
    # No worker reports yet: 16 slots, 2 kept for VIP, 2 s an answer, 7 normal jobs/s a worker.
    settings.INFERENCE_MAX_NUM_SEQS, settings.VIP_RESERVED_SLOTS, settings.SERVICE_TIME_PRIOR_S = 16, 2, 2.0
    assert warm_spares() == 0
    assert serving_needed(model=MODEL) is None
    WarmPool.objects.update_or_create(pk=1, defaults={"spares": 1})
    spares_mirror()
    assert warm_spares() == 1
    assert serving_needed(model=MODEL) == 1  # no traffic: one serves all the same
    # 200 admitted in the last 30-35 s and all still queued (60 s SLO): 9 to 10 jobs/s.
    for _ in range(200):
        assert job_enqueue(
            tier="normal", job=generation_job(), max_queued=1000, wait_slo_s=10**6, max_wait_s=60
        ).admitted
    assert serving_needed(model=MODEL) == 2


def test_the_mirror_is_rebuilt_from_the_database_when_redis_lost_it():
    WarmPool.objects.update_or_create(pk=1, defaults={"spares": 2})
    assert warm_spares() == 2
    assert sync_redis().get(keys.WARM_SPARES) == "2"


def test_a_worker_that_stops_leaves_the_serving_set():
    _decide(1, "w1")

    async def remove() -> None:
        client = new_async_redis()
        try:
            await workers.heartbeat_remove(client, worker_id="w1", model=MODEL)
        finally:
            await client.aclose()

    asyncio.run(remove())
    assert _serving() == set()
