import asyncio
import dataclasses
import time

import pytest

from scheduler import keys
from scheduler.queues import JobQueue, job_enqueue
from scheduler.rate_limits import Bucket, RateCharge
from scheduler.redis import new_async_redis, sync_redis
from tests.generation_jobs import MODEL, generation_job


def _enqueue(request_id: str, tier: str = "normal", max_queued: int = 100, wait_slo_s: float = 1000):
    return job_enqueue(
        tier=tier,
        job=generation_job(request_id, tier=tier, messages=[{"role": "user", "content": request_id}]),
        max_queued=max_queued,
        wait_slo_s=wait_slo_s,
        max_wait_s=60,
    )


def _with_queue(consumer: str, body):
    async def run():
        client = new_async_redis()
        queue = JobQueue(client, model=MODEL, consumer=consumer)
        await queue.ensure_groups()
        try:
            return await body(queue)
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_enqueue_reports_the_position_and_refuses_beyond_the_bound():
    positions = [_enqueue(f"r{n}", max_queued=3).position for n in range(3)]
    assert positions == [1, 2, 3]
    refused = _enqueue("r3", max_queued=3)
    assert not refused.admitted
    assert refused.refusal == "queue_full"
    assert refused.predicted_wait_s > 0


def test_enqueue_refuses_when_the_predicted_wait_exceeds_the_slo():
    # Nothing has drained yet, so the cold-start drain rate (0.2 jobs/s) applies: 5 s per job.
    assert _enqueue("a", wait_slo_s=7).admitted
    assert _enqueue("b", wait_slo_s=7).admitted  # 1 ahead: 5 s
    refused = _enqueue("c", wait_slo_s=7)  # 2 ahead: 10 s
    assert (refused.admitted, refused.refusal) == (False, "wait_over_slo")
    assert refused.predicted_wait_s == 10


def test_claims_take_vip_first_and_never_more_than_the_free_slots():
    for n in range(3):
        _enqueue(f"normal-{n}")
    for n in range(2):
        _enqueue(f"vip-{n}", tier="vip")

    async def body(queue):
        first = await queue.claim(total=3, per_tier={"vip": 3, "normal": 3})
        second = await queue.claim(total=5, per_tier={"vip": 5, "normal": 1})
        return first, second

    first, second = _with_queue("w1", body)
    assert [j.request_id for j in first] == ["vip-0", "vip-1", "normal-0"]
    assert [j.request_id for j in second] == ["normal-1"]


def test_the_enqueued_job_announces_itself_in_the_result_stream():
    _enqueue("r1", tier="vip")
    entries = sync_redis().xrange(keys.result(MODEL, "r1"))
    assert [fields["type"] for _, fields in entries] == ["queued"]


def test_a_dead_workers_jobs_are_taken_over_after_the_lease_until_attempts_run_out():
    _enqueue("r1")

    async def body(dead_queue):
        [job] = await dead_queue.claim(total=1, per_tier={"normal": 1})
        live = JobQueue(dead_queue.client, model=MODEL, consumer="live")
        too_early = await live.reclaim_expired(lease_s=5, max_count=4, max_attempts=2)
        await asyncio.sleep(0.15)
        second = await live.reclaim_expired(lease_s=0.1, max_count=4, max_attempts=2)
        await asyncio.sleep(0.15)
        third = await live.reclaim_expired(lease_s=0.1, max_count=4, max_attempts=2)
        return job, too_early, second, third

    job, too_early, second, third = _with_queue("dead", body)
    assert job.attempt == 1
    assert too_early == ([], [])
    assert [(j.request_id, j.attempt) for j in second[0]] == [("r1", 2)]
    assert second[1] == []
    assert third[0] == [] and [(j.request_id, j.attempt) for j in third[1]] == [("r1", 3)]


def test_a_renewed_lease_keeps_the_job_and_a_released_job_is_taken_at_once():
    _enqueue("r1")

    async def body(queue):
        [job] = await queue.claim(total=1, per_tier={"normal": 1})
        other = JobQueue(queue.client, model=MODEL, consumer="other")
        await asyncio.sleep(0.15)
        await queue.renew_leases([job])
        kept = await other.reclaim_expired(lease_s=0.1, max_count=4, max_attempts=3)
        await queue.release(job)
        taken = await other.reclaim_expired(lease_s=10, max_count=4, max_attempts=3)
        return kept, taken

    kept, taken = _with_queue("w1", body)
    assert kept == ([], [])
    # A drained job does not count as a failed attempt.
    assert [(j.request_id, j.attempt) for j in taken[0]] == [("r1", 1)]


def test_a_normal_job_waiting_past_the_aging_limit_goes_before_vip():
    _enqueue("old-normal")

    async def body(queue):
        await asyncio.sleep(0.3)
        _enqueue("new-vip", tier="vip")
        fresh = await queue.claim(total=1, per_tier={"vip": 1, "normal": 1}, aging_s=10)
        aged = await queue.claim(total=1, per_tier={"vip": 1, "normal": 1}, aging_s=0.2)
        return fresh, aged

    _enqueue("other-vip", tier="vip")
    fresh, aged = _with_queue("w1", body)
    assert [j.request_id for j in fresh] == ["other-vip"]
    assert [j.request_id for j in aged] == ["old-normal"]


def test_the_predicted_wait_counts_higher_tiers_ahead_and_uses_live_workers_capacity():
    now = time.time()
    # One live worker finishing 2 jobs/s in all, 1 job/s of normal traffic.
    sync_redis().hset(keys.capacity(MODEL), "w1", f"2.0|1.0|{now}")
    for n in range(4):
        _enqueue(f"vip-{n}", tier="vip")
    vip = _enqueue("vip-4", tier="vip")
    normal = _enqueue("normal-0")
    assert vip.predicted_wait_s == 2.0  # 4 VIP ahead at 2 jobs/s
    assert normal.predicted_wait_s == 5.0  # 5 VIP ahead at 1 job/s


def _consumers(tier: str = "normal") -> dict[str, int]:
    infos = sync_redis().xinfo_consumers(keys.queue(MODEL, tier), keys.CONSUMER_GROUP)
    return {info["name"]: info["pending"] for info in infos}


def _report_capacity(worker_id: str, at: float) -> None:
    sync_redis().hset(keys.capacity(MODEL), worker_id, f"1.0|1.0|{at}")


def test_dead_workers_are_forgotten_once_they_hold_no_job_and_live_ones_are_kept():
    _enqueue("held-by-the-dead")
    long_ago = time.time() - 3600

    async def body(queue):
        dead = JobQueue(queue.client, model=MODEL, consumer="dead")
        [job] = await dead.claim(total=1, per_tier={"normal": 1})
        for holding_nothing in ("idle-dead", "live"):
            sync_redis().xgroup_createconsumer(
                keys.queue(MODEL, "normal"), keys.CONSUMER_GROUP, holding_nothing
            )
        _report_capacity("dead", long_ago)
        _report_capacity("idle-dead", long_ago)
        _report_capacity("live", time.time())

        await queue.dead_workers_forget(stale_s=5)
        first = (_consumers(), set(sync_redis().hkeys(keys.capacity(MODEL))))
        runnable, _ = await queue.reclaim_expired(lease_s=0, max_count=1, max_attempts=3)
        await queue.dead_workers_forget(stale_s=5)
        second = (_consumers(), set(sync_redis().hkeys(keys.capacity(MODEL))))
        return job, runnable, first, second

    job, runnable, first, second = _with_queue("live", body)
    # The dead worker holding a job keeps its consumer (deleting it would strand the job).
    assert first == ({"dead": 1, "live": 0}, {"dead", "live"})
    assert [j.request_id for j in runnable] == [job.request_id]
    # Once its job is taken over, it is forgotten too.
    assert second == ({"live": 1}, {"live"})


def _charged_enqueue(request_id: str, bucket: Bucket, *, max_queued: int = 100, tokens: int = 0):
    charge = RateCharge(
        buckets=(bucket,),
        inflight_key=keys.inflight("c1"),
        max_inflight=100,
        request_id=request_id,
        lapse_s=60,
        reservation=(keys.key_token_reservations("c1"), tokens) if tokens else None,
    )
    return job_enqueue(
        tier="normal",
        job=generation_job(request_id),
        max_queued=max_queued,
        wait_slo_s=1000,
        max_wait_s=60,
        charge=charge,
    )


def _queue_length() -> int:
    return sync_redis().xlen(keys.queue(MODEL, "normal"))


def test_a_charged_enqueue_takes_the_rate_limit_and_queues_the_job_in_one_step():
    bucket = Bucket(keys.bucket_user("c1"), "user", capacity=10, refill_per_s=0.001, cost=3)
    queued = _charged_enqueue("r1", bucket, tokens=3)
    assert (queued.admitted, queued.position) == (True, 1)
    assert queued.rate is not None and queued.rate.allowed
    assert queued.rate.levels == pytest.approx((7,), abs=0.01)  # after the charge
    assert sync_redis().zscore(keys.inflight("c1"), "r1") is not None
    assert sync_redis().hget(keys.key_token_reservations("c1"), "r1") == "3"
    assert _queue_length() == 1


def test_a_rate_limit_refusal_queues_nothing():
    bucket = Bucket(keys.bucket_user("c1"), "user", capacity=1, refill_per_s=0.001)
    assert _charged_enqueue("r1", bucket).admitted
    refused = _charged_enqueue("r2", bucket)
    assert (refused.admitted, refused.refusal) == (False, "rate_limited")
    assert refused.rate is not None and refused.rate.limited_by == "user"
    assert _queue_length() == 1
    assert sync_redis().zscore(keys.inflight("c1"), "r2") is None


def test_a_queue_refusal_charges_nothing():
    bucket = Bucket(keys.bucket_user("c1"), "user", capacity=10, refill_per_s=0.001)
    assert _charged_enqueue("r1", bucket, max_queued=1, tokens=5).admitted
    for n in range(3):
        refused = _charged_enqueue(f"full-{n}", bucket, max_queued=1, tokens=5)
        assert (refused.admitted, refused.refusal, refused.rate) == (False, "queue_full", None)
    # Not a token, a place among the unfinished requests or a reservation was taken by them.
    assert float(sync_redis().hget(keys.bucket_user("c1"), "tokens")) == pytest.approx(9, abs=0.01)
    assert sync_redis().zrange(keys.inflight("c1"), 0, -1) == ["r1"]
    assert sync_redis().hkeys(keys.key_token_reservations("c1")) == ["r1"]


# --- affinity: a conversation's next turn on the worker that answered its last ----------------


def _turn(request_id: str, conversation: str, client_id: str = "guest:a") -> None:
    job = dataclasses.replace(generation_job(request_id, client_id=client_id), conversation_id=conversation)
    assert job_enqueue(tier="normal", job=job, max_queued=100, wait_slo_s=1000, max_wait_s=60).admitted


def _serving(**last_seen: float) -> None:
    sync_redis().zadd(keys.serving(MODEL), last_seen)


def _claimed_by(consumer: str) -> list[str]:
    async def body(queue):
        return [job.request_id for job in await queue.claim(total=1, per_tier={"normal": 1})]

    return _with_queue(consumer, body)


def _claimed_by_blocking_read(consumer: str) -> list[str]:
    async def body(queue):
        jobs = await queue.claim_blocking(["normal"], timeout_s=5)
        await queue.recordings_wait(timeout_s=5)
        return [job.request_id for job in jobs]

    return _with_queue(consumer, body)


def test_an_idle_worker_s_read_remembers_the_conversation_only_with_fair_share(settings):
    # Affinity is read by the fair claim only: without it, a turn leaves no key behind.
    settings.FAIR_SHARE = False
    _turn("turn-1", "conversation-a")
    assert _claimed_by_blocking_read("w1") == ["turn-1"]
    assert sync_redis().get(keys.claimed_seq(MODEL, "normal")) == "1"  # the claim was recorded
    assert sync_redis().get(keys.affinity_prefix(MODEL) + "conversation-a") is None

    settings.FAIR_SHARE = True
    _turn("turn-2", "conversation-b", client_id="guest:b")
    assert _claimed_by_blocking_read("w1") == ["turn-2"]
    assert sync_redis().get(keys.affinity_prefix(MODEL) + "conversation-b") == "w1"


def test_a_conversation_s_next_turn_is_left_to_the_worker_that_answered_its_last(settings):
    settings.AFFINITY_WAIT_S = 600  # longer than the test
    _serving(w1=time.time(), w2=time.time())
    _turn("turn-1", "conversation-a")
    assert _claimed_by("w1") == ["turn-1"]
    _turn("turn-2", "conversation-a")
    _turn("other", "conversation-b", client_id="guest:b")

    assert _claimed_by("w2") == ["other"]  # another conversation's turn goes first meanwhile
    assert _claimed_by("w2") == []
    assert _claimed_by("w1") == ["turn-2"]


def test_past_the_bound_any_worker_takes_the_turn(settings):
    settings.AFFINITY_WAIT_S = 0.2
    _serving(w1=time.time(), w2=time.time())
    _turn("turn-1", "conversation-a")
    assert _claimed_by("w1") == ["turn-1"]
    _turn("turn-2", "conversation-a")
    deadline = time.monotonic() + 10
    while not (claimed := _claimed_by("w2")):
        assert time.monotonic() < deadline, "the turn was never released to another worker"
        _serving(w1=time.time(), w2=time.time())  # both keep serving
        time.sleep(0.05)
    assert claimed == ["turn-2"]


def test_a_draining_or_dead_worker_loses_its_conversations_at_once(settings):
    settings.AFFINITY_WAIT_S = 600
    _serving(w1=time.time(), w2=time.time(), w3=time.time())
    for n, conversation in enumerate(["conversation-a", "conversation-b"]):
        _turn(f"{conversation}-1", conversation, client_id=f"guest:{n}")
        assert _claimed_by("w1") == [f"{conversation}-1"]
        _turn(f"{conversation}-2", conversation, client_id=f"guest:{n}")
    assert _claimed_by("w2") == []

    sync_redis().zrem(keys.serving(MODEL), "w1")  # draining: it leaves the serving workers
    assert _claimed_by("w2") == ["conversation-a-2"]
    _serving(w1=time.time() - 60)  # back, but its heartbeat stopped a minute ago: dead
    assert _claimed_by("w3") == ["conversation-b-2"]


def test_a_worker_waiting_beside_others_wakes_when_a_turn_arrives_and_leaves_it_to_the_claim():
    """With another worker serving, a worker does not take a turn off the stream (its
    conversation's worker may be the other): it waits for one to arrive, and then claims."""

    async def body(queue):
        waiting = asyncio.create_task(queue.wait_for_arrival(["normal"], timeout_s=4))
        # The turn arrives once the read blocks (flag `b`: an earlier test's connection that
        # read last shows `xread` too, and a turn sent before the wait starts is not an arrival).
        deadline = time.monotonic() + 10
        while not any(c["cmd"] == "xread" and "b" in c["flags"] for c in sync_redis().client_list()):
            assert time.monotonic() < deadline, "the read never blocked"
            await asyncio.sleep(0.01)
        await asyncio.to_thread(_turn, "turn-1", "conversation-a")
        assert await waiting, "it timed out before the turn woke it"
        left = sync_redis().xpending(keys.queue(MODEL, "normal"), keys.CONSUMER_GROUP)["pending"]
        return left, [job.request_id for job in await queue.claim(total=1, per_tier={"normal": 1})]

    assert _with_queue("w1", body) == (0, ["turn-1"])


def test_a_turn_that_arrives_between_two_waits_wakes_the_second_at_once():
    async def body(queue):
        assert not await queue.wait_for_arrival(["normal"], timeout_s=0.05)  # nothing yet
        await asyncio.to_thread(_turn, "turn-1", "conversation-a")
        return await queue.wait_for_arrival(["normal"], timeout_s=4)

    assert _with_queue("w1", body), "the turn that arrived between the waits was missed"
