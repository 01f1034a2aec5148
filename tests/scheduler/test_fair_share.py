import asyncio
import time

import pytest

from scheduler import keys
from scheduler.admission import request_submit
from scheduler.fair_share import FairShare, fair_share_settle
from scheduler.generation import Origin
from scheduler.queues import JobQueue, job_enqueue
from scheduler.redis import new_async_redis, sync_redis
from tests.generation_jobs import MODEL, generation_job


def _enqueue(
    request_id: str,
    *,
    client_id: str,
    origin: Origin = Origin.CHAT,
    max_tokens: int = 16,
    tier: str = "normal",
    weight: float = 1.0,
) -> None:
    job = generation_job(request_id, tier=tier, client_id=client_id, origin=origin, max_tokens=max_tokens)
    admitted = job_enqueue(
        tier=tier,
        job=job,
        max_queued=1000,
        wait_slo_s=10_000,
        max_wait_s=600,
        share=FairShare.of(job, weight=weight),
    )
    assert admitted.admitted


def _claims(*, one_at_a_time: int, fair_share: bool = True, tiers: dict[str, int] | None = None) -> list[str]:
    """The request ids a worker claims, one per free slot, `one_at_a_time` times."""

    async def run() -> list[str]:
        client = new_async_redis()
        queue = JobQueue(client, model=MODEL, consumer="w1", fair_share=fair_share)
        await queue.ensure_groups()
        try:
            claimed = []
            for _ in range(one_at_a_time):
                jobs = await queue.claim(total=1, per_tier=tiers or {"vip": 1, "normal": 1, "batch": 1})
                claimed += [job.request_id for job in jobs]
            return claimed
        finally:
            await client.aclose()

    return asyncio.run(run())


def test_a_flooding_key_cannot_starve_a_chat_customer_who_asked_after_it():
    for n in range(20):
        _enqueue(f"flood-{n}", client_id="key:1", origin=Origin.API)
    _enqueue("chat-0", client_id="guest:a")
    _enqueue("chat-1", client_id="guest:a")

    claimed = _claims(one_at_a_time=4)

    # Arrival order would serve the customer 21st and 22nd.
    assert {"chat-0", "chat-1"} <= set(claimed)
    assert claimed.index("chat-0") < claimed.index("chat-1")


def test_arrival_order_is_kept_when_fair_share_is_off():
    for n in range(5):
        _enqueue(f"flood-{n}", client_id="key:1", origin=Origin.API)
    _enqueue("chat-0", client_id="guest:a")

    assert _claims(one_at_a_time=3, fair_share=False) == ["flood-0", "flood-1", "flood-2"]


def test_a_source_alone_gets_every_slot_in_its_own_order():
    for n in range(6):
        _enqueue(f"only-{n}", client_id="key:1", origin=Origin.API)

    async def run() -> list[str]:
        client = new_async_redis()
        queue = JobQueue(client, model=MODEL, consumer="w1", fair_share=True)
        await queue.ensure_groups()
        try:
            jobs = await queue.claim(total=6, per_tier={"vip": 6, "normal": 6, "batch": 6})
            return [job.request_id for job in jobs]
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [f"only-{n}" for n in range(6)]


def test_sources_are_charged_by_tokens_not_requests():
    for n in range(5):
        _enqueue(f"long-{n}", client_id="key:long", origin=Origin.API, max_tokens=1000)
        _enqueue(f"short-{n}", client_id="key:short", origin=Origin.API, max_tokens=10)

    claimed = _claims(one_at_a_time=6)

    # One long answer costs as much as the short source's five together.
    assert sorted(claimed) == ["long-0", "short-0", "short-1", "short-2", "short-3", "short-4"]


def test_a_heavier_weight_gets_a_larger_share():
    for n in range(9):
        _enqueue(f"gold-{n}", client_id="key:gold", origin=Origin.API, weight=2.0)
        _enqueue(f"plain-{n}", client_id="key:plain", origin=Origin.API)

    claimed = _claims(one_at_a_time=9)

    assert sum(1 for r in claimed if r.startswith("gold")) == 6
    assert sum(1 for r in claimed if r.startswith("plain")) == 3


def test_an_answer_shorter_than_its_most_is_charged_what_it_used():
    # Both sources are served one answer of at most 1000 tokens; the second one used 10.
    for n in range(3):
        _enqueue(f"a-{n}", client_id="key:a", origin=Origin.API, max_tokens=1000)
        _enqueue(f"b-{n}", client_id="key:b", origin=Origin.API, max_tokens=1000)
    first, second = _claims(one_at_a_time=2)
    assert first[0] != second[0]
    used_little = generation_job(second, client_id="key:" + second[0], origin=Origin.API, max_tokens=1000)

    async def settle() -> None:
        client = new_async_redis()
        try:
            await fair_share_settle(
                client,
                model=MODEL,
                tier="normal",
                share=FairShare.of(used_little),
                prompt_tokens=4,
                completion_tokens=10,
            )
        finally:
            await client.aclose()

    asyncio.run(settle())

    [third] = _claims(one_at_a_time=1)
    assert third[0] == second[0]  # the source that used little is served again first


def test_a_source_back_from_idle_banks_no_more_than_the_credit():
    # key:old was served long ago, before key:busy took the tier alone for many answers.
    _enqueue("old-0", client_id="key:old", origin=Origin.API, max_tokens=100)
    assert _claims(one_at_a_time=1) == ["old-0"]
    for n in range(30):
        _enqueue(f"busy-{n}", client_id="key:busy", origin=Origin.API, max_tokens=100)
    assert len(_claims(one_at_a_time=20)) == 20
    for n in range(5):
        _enqueue(f"old-{n + 1}", client_id="key:old", origin=Origin.API, max_tokens=100)

    claimed = _claims(one_at_a_time=8)

    # Starting 20 answers behind would take the next 5 slots and more; the idle credit (256
    # tokens, about 2 of these answers) gives it the next few, then the two alternate.
    olds = [n for n, r in enumerate(claimed) if r.startswith("old")]
    busies = [n for n, r in enumerate(claimed) if r.startswith("busy")]
    assert busies and busies[0] <= 4
    assert len(olds) >= 3


def test_the_chat_customer_waits_behind_vip_still():
    for n in range(3):
        _enqueue(f"normal-{n}", client_id="guest:a")
    _enqueue("vip-0", client_id="guest:b", tier="vip")

    assert _claims(one_at_a_time=2) == ["vip-0", "normal-0"]


def test_jobs_waiting_their_turn_are_not_taken_over_as_expired_leases():
    for n in range(3):
        _enqueue(f"r{n}", client_id="key:1", origin=Origin.API)

    async def run() -> tuple[list[str], list[str]]:
        client = new_async_redis()
        queue = JobQueue(client, model=MODEL, consumer="w1", fair_share=True)
        await queue.ensure_groups()
        try:
            claimed = await queue.claim(total=1, per_tier={"normal": 1})
            runnable, exhausted = await queue.reclaim_expired(lease_s=0, max_count=10, max_attempts=3)
            return [job.request_id for job in claimed], [job.request_id for job in runnable + exhausted]
        finally:
            await client.aclose()

    claimed, taken_over = asyncio.run(run())
    assert claimed == ["r0"]
    assert taken_over == ["r0"]  # the claimed one's lease (0 s) expired; r1, r2 still wait
    assert sync_redis().llen(keys.fair_backlog_prefix(MODEL, "normal") + "api:key:1") == 2


async def _claim_under(source: str) -> list[str]:
    client = new_async_redis()
    queue = JobQueue(client, model=MODEL, consumer="w1", fair_share=True)
    try:
        jobs = await queue.claim(total=1, per_tier={"normal": 1}, under_share_of=source)
        return [job.request_id for job in jobs]
    finally:
        await client.aclose()


def test_a_job_taken_to_pause_an_answer_for_must_be_of_a_source_served_less(settings):
    settings.FAIR_SHARE_PREEMPT_AFTER_S = 0.0
    for n in range(3):
        _enqueue(f"flood-{n}", client_id="key:1", origin=Origin.API)
    assert _claims(one_at_a_time=2) == ["flood-0", "flood-1"]

    # The key's own next job is never taken to pause its answer for.
    assert asyncio.run(_claim_under("api:key:1")) == []
    _enqueue("chat-0", client_id="guest:a")
    assert asyncio.run(_claim_under("api:key:1")) == ["chat-0"]


def test_a_job_is_taken_to_pause_an_answer_for_only_once_it_has_waited_out_the_grace(settings):
    settings.FAIR_SHARE_PREEMPT_AFTER_S = 1.0
    for n in range(3):
        _enqueue(f"flood-{n}", client_id="key:1", origin=Origin.API)
    assert _claims(one_at_a_time=2) == ["flood-0", "flood-1"]
    queued_at = time.monotonic()
    _enqueue("chat-0", client_id="guest:a")

    async def claim_when_taken() -> tuple[list[str], float]:
        while time.monotonic() - queued_at < 30:
            taken = await _claim_under("api:key:1")
            if taken:
                return taken, time.monotonic() - queued_at
            await asyncio.sleep(0.05)
        return [], time.monotonic() - queued_at

    taken, waited_s = asyncio.run(claim_when_taken())

    assert taken == ["chat-0"]
    assert waited_s >= settings.FAIR_SHARE_PREEMPT_AFTER_S


def test_a_slot_turning_over_takes_a_job_under_its_share_whatever_the_grace(settings):
    settings.FAIR_SHARE_PREEMPT_AFTER_S = 60.0
    for n in range(3):
        _enqueue(f"flood-{n}", client_id="key:1", origin=Origin.API)
    assert _claims(one_at_a_time=2) == ["flood-0", "flood-1"]
    _enqueue("chat-0", client_id="guest:a")

    assert asyncio.run(_claim_under("api:key:1")) == []  # not waited out: pauses nothing
    assert _claims(one_at_a_time=1) == ["chat-0"]  # a free slot: ahead of the key's next


def test_a_source_served_alone_all_night_is_not_starved_by_a_newcomer_in_the_morning():
    # key:night asks one answer at a time through the night: each is served at once, alone.
    for n in range(40):
        _enqueue(f"night-{n}", client_id="key:night", origin=Origin.API, max_tokens=100)
        assert _claims(one_at_a_time=1) == [f"night-{n}"]
    # In the morning a chat customer starts asking, and the key goes on.
    for n in range(10):
        _enqueue(f"chat-{n}", client_id="guest:morning", max_tokens=100)
        _enqueue(f"key-{n}", client_id="key:night", origin=Origin.API, max_tokens=100)

    claimed = _claims(one_at_a_time=8)

    # The customer starts with the idle credit (about 2 of these answers) over the key, not
    # with the 40 answers the key was served alone.
    assert sum(1 for r in claimed if r.startswith("key-")) >= 3


def test_a_source_served_alone_by_the_idle_workers_read_is_not_starved_by_a_newcomer():
    async def serve_alone(n: int) -> list[str]:
        client = new_async_redis()
        queue = JobQueue(client, model=MODEL, consumer="w1", fair_share=True)
        await queue.ensure_groups()
        try:
            jobs = await queue.claim_blocking(["normal"], timeout_s=5)
            await queue.recordings_wait(timeout_s=5)
            return [job.request_id for job in jobs]
        finally:
            await client.aclose()

    for n in range(40):
        _enqueue(f"night-{n}", client_id="key:night", origin=Origin.API, max_tokens=100)
        assert asyncio.run(serve_alone(n)) == [f"night-{n}"]
    for n in range(10):
        _enqueue(f"chat-{n}", client_id="guest:morning", max_tokens=100)
        _enqueue(f"key-{n}", client_id="key:night", origin=Origin.API, max_tokens=100)

    claimed = _claims(one_at_a_time=8)

    assert sum(1 for r in claimed if r.startswith("key-")) >= 3


def test_counters_of_sources_gone_quiet_are_forgotten():
    for n in range(30):
        _enqueue(f"guest-{n}", client_id=f"guest:{n}", max_tokens=1000)
        assert _claims(one_at_a_time=1) == [f"guest-{n}"]

    # Each left the tier last, raising the floor past the earlier ones' counters.
    assert sync_redis().zcard(keys.fair_counters(MODEL, "normal")) <= 2


def test_one_off_sources_served_less_than_the_credit_are_not_all_remembered(settings):
    settings.FAIR_SHARE_SOURCES_KEPT = 5
    # Each guest asks one short question alone: none raises the floor, every counter is kept
    # within the credit below it, one more per guest.
    for n in range(20):
        _enqueue(f"guest-{n}", client_id=f"guest:{n}", max_tokens=16)
        assert _claims(one_at_a_time=1) == [f"guest-{n}"]

    assert sync_redis().zcard(keys.fair_counters(MODEL, "normal")) <= 5


@pytest.mark.django_db
def test_a_guest_making_many_sessions_gets_one_share_of_its_address():
    # One client opens a session per question (a new guest id each time, free to make).
    for n in range(8):
        flood = generation_job(client_id=f"guest:f{n // 2}", max_tokens=100)
        request_submit(job=flood, client_address="203.0.113.7")
    other = [generation_job(client_id="guest:z", max_tokens=100) for _ in range(2)]
    for job in other:
        request_submit(job=job, client_address="198.51.100.2")

    claimed = _claims(one_at_a_time=4)

    # Four sessions would be four shares, served before the other guest's second question.
    assert {job.request_id for job in other} <= set(claimed)
