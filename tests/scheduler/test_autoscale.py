import asyncio
import time

import pytest

from scheduler import workers
from scheduler.autoscale import TierDemand, WorkerShape, workers_desired, workers_needed
from scheduler.queues import ARRIVAL_BUCKET_S, arrival_rates, job_enqueue
from scheduler.redis import new_async_redis
from tests.generation_jobs import MODEL, generation_job

pytestmark = pytest.mark.django_db

# 16 slots, 2 kept for VIP, 2 s an answer: a worker finishes 8 jobs/s, 7 of them below VIP.
SHAPE = WorkerShape(slots=16, vip_reserved_slots=2, mean_service_s=2.0)


def _demands(
    *, vip: float = 0.0, normal: float = 0.0, batch: float = 0.0, normal_queued: int = 0
) -> list[TierDemand]:
    return [
        TierDemand(tier="vip", arrivals_per_s=vip, queued=0, wait_slo_s=10),
        TierDemand(tier="normal", arrivals_per_s=normal, queued=normal_queued, wait_slo_s=60),
        TierDemand(tier="batch", arrivals_per_s=batch, queued=0, wait_slo_s=86400),
    ]


def _needed(target_utilization: float = 1.0, **demand: float) -> int:
    return workers_needed(demands=_demands(**demand), shape=SHAPE, target_utilization=target_utilization)


def test_no_traffic_needs_no_worker():
    assert _needed() == 0


def test_vip_traffic_may_use_every_slot():
    assert _needed(vip=8) == 1
    assert _needed(vip=8.5) == 2
    assert _needed(vip=24) == 3


def test_normal_traffic_leaves_the_vip_reserve_free():
    assert _needed(normal=7) == 1
    assert _needed(normal=7.5) == 2  # 7.5 of 8 jobs/s, but only 7 may be normal
    assert _needed(normal=5, batch=2) == 1
    assert _needed(normal=14) == 2


def test_mixed_traffic_needs_the_larger_of_whole_workers_and_their_shared_slots():
    assert _needed(vip=2, normal=6) == 1  # 8 of 8 jobs/s, 6 of 7 below VIP
    assert _needed(vip=2, normal=7) == 2  # 9 jobs/s overall


def test_the_queue_is_cleared_within_the_tiers_slo():
    # 7 jobs/s arrive and fill one worker; 60 queued more ask for 1 job/s on top: two workers.
    assert _needed(normal=7, normal_queued=0) == 1
    assert _needed(normal=7, normal_queued=60) == 2
    assert _needed(normal_queued=420) == 1  # 7 jobs/s for 60 s


def test_the_target_utilization_leaves_room_for_a_burst():
    assert _needed(normal=7, target_utilization=1.0) == 1
    assert _needed(normal=7, target_utilization=0.8) == 2
    assert _needed(normal=5.6, target_utilization=0.8) == 1


def _enqueue(request_id: str, tier: str, *, max_queued: int = 1000) -> bool:
    return job_enqueue(
        tier=tier,
        job=generation_job(request_id, tier=tier),
        max_queued=max_queued,
        wait_slo_s=10**6,
        max_wait_s=60,
    ).admitted


def test_admitted_jobs_count_as_arrivals_and_refused_ones_do_not(settings):
    settings.AUTOSCALE_ARRIVAL_WINDOW_S = 30
    for n in range(12):
        assert _enqueue(f"n{n}", "normal", max_queued=12)
    assert not _enqueue("refused", "normal", max_queued=12)
    for n in range(3):
        assert _enqueue(f"v{n}", "vip")
    now = time.time()
    # The window starts at the bucket holding now - 30 s, so it spans 30 to 35 seconds.
    window_s = now - (now - 30) // ARRIVAL_BUCKET_S * ARRIVAL_BUCKET_S
    rates = arrival_rates(model=MODEL, now=now)
    assert rates["normal"] * window_s == pytest.approx(12)
    assert rates["vip"] * window_s == pytest.approx(3)
    assert rates["batch"] == 0
    assert arrival_rates(model="other-model", now=now) == {"vip": 0, "normal": 0, "batch": 0}
    # Once the window has passed, they no longer count.
    assert arrival_rates(model=MODEL, now=now + 40)["normal"] == 0


def _heartbeat(worker_id: str, *, model: str = MODEL, draining: bool = False) -> None:
    info = {
        "model": model,
        "engine": "simulated",
        "slots": 16,
        "vip_reserved_slots": 2,
        "mean_service_s": 2.0,
        "running": 0,
        "draining": draining,
    }

    async def write() -> None:
        client = new_async_redis()
        try:
            await workers.heartbeat_write(
                client, worker_id=worker_id, info=info, jobs_per_s=8.0, normal_jobs_per_s=7.0
            )
        finally:
            await client.aclose()

    asyncio.run(write())


def test_the_desired_count_reads_the_workers_heartbeats_and_the_policies(settings):
    settings.AUTOSCALE_TARGET_UTILIZATION = 1.0
    settings.SERVICE_TIME_PRIOR_S = 50.0  # would ask for far more workers, were it used
    _heartbeat("w1")
    _heartbeat("w2", model="other-model")
    live = workers.live_workers()
    # The normal tier's SLO is 60 s: 420 queued normal jobs need 7 jobs/s, one worker's share.
    assert workers_desired(model=MODEL, workers=live, queued={"normal": 420}) == 1
    assert workers_desired(model=MODEL, workers=live, queued={"normal": 421}) == 2
    assert workers_desired(model=MODEL, workers=live, queued={}) == 0
