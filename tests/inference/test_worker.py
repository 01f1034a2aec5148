"""The worker's decisions, without processes: which tiers may start (`Slots.room`), aging, and
each way a job can end (`inference.answering`). A scripted engine stands in for the model; the queue, the
result stream and the generation record are the real ones (test Redis, test database)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from inference import outcomes as outcomes_module
from inference.engines.base import Delta, EngineDeadError, EngineRequestError, EngineStats, GenerationRequest
from inference.engines.simulated import SimulatedEngine, simulated_answer_tokens
from inference.metrics import FAIR_SHARE_PREEMPTIONS, PREEMPTIONS
from inference.slots import Answer
from inference.worker import InferenceWorker, WorkerConfig
from scheduler import control, keys
from scheduler.admission import request_submit
from scheduler.fair_share import FairShare
from scheduler.generation import (
    Grounding,
    GroundingSource,
    Origin,
    Reset,
    SamplingParams,
    StructuredOutput,
    Tier,
)
from scheduler.models import Generation, TierPolicy, WarmPool
from scheduler.policy import policies_mirror
from scheduler.queues import Job, JobQueue
from scheduler.redis import new_async_redis, sync_redis
from scheduler.services import GenerationOutcome, generation_finish
from scheduler.warmpool import serving_decide, serving_leave, spares_mirror
from tests.generation_jobs import MODEL, generation_job

# Committed transactions: the worker stores answers from a thread of its own, with its own
# database connection, as it does in production.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("tier_policies")]

HANG = "hang"  # the engine stops producing and waits (to be cancelled or timed out)


class ScriptedEngine:
    """Streams the given texts, then ends (`stop`), hangs, or raises the given exception."""

    label = "scripted"
    max_num_seqs = 4

    def __init__(self, *texts: str, then: BaseException | str | None = None) -> None:
        self.texts = texts
        self.then = then
        self.wrote_all = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        for n, text in enumerate(self.texts, start=1):
            last = n == len(self.texts) and self.then is None
            yield Delta(text=text, output_tokens=n, prompt_tokens=5, finish_reason="stop" if last else None)
        self.wrote_all.set()
        if self.then == HANG:
            await asyncio.Event().wait()
        elif isinstance(self.then, BaseException):
            raise self.then

    async def start(self) -> None: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0.0, 0, 0, "process-rss")

    async def shutdown(self) -> None: ...


def _worker(engine: Any, **config: Any) -> InferenceWorker:
    defaults = {
        "model": MODEL,
        "vip_reserved_slots": 1,
        "lease_s": 30.0,
        "max_attempts": 3,
        "generation_timeout_s": 30.0,
        "heartbeat_s": 1.0,
        "drain_timeout_s": 1.0,
        "service_time_prior_s": 1.0,
        "normal_aging_s": 30.0,
        "batch_max_slots": 2,
        "vip_preemption": True,
    }
    return InferenceWorker(engine, WorkerConfig(**{**defaults, **config}))


def _serve(
    worker: InferenceWorker,
    *,
    before: Callable[[InferenceWorker, Job], Awaitable[None]] | None = None,
    adjust: Callable[[Job], Job] = lambda job: job,
) -> Job:
    """Claim the one queued job and serve it as the worker does, to its end."""

    async def serve() -> Job:
        [job] = await worker.queue.claim(total=1, per_tier=dict.fromkeys(Tier, 1))
        job = adjust(job)
        await worker._start_jobs([job])
        task = worker.running[job.request_id].task
        if before is not None:
            await before(worker, job)
        await asyncio.wait([task])
        # Events are written in the order emitted: once this one is in Redis, so is all the
        # job emitted (a job the engine died under ends before its last token is written).
        marker = worker.publisher.emit(MODEL, "written-up-to-here", Reset(reason="test", attempt=0))
        await asyncio.wait_for(marker, 10.0)
        return job

    return _with_queue(worker, serve)


def _submit(tier: str = Tier.NORMAL) -> str:
    job = generation_job(tier=tier, disconnect_grace_s=10.0)
    request_submit(job=job)
    return job.request_id


def _events(request_id: str) -> list[tuple[str, dict]]:
    entries = sync_redis().xrange(keys.result(MODEL, request_id))
    return [(fields["type"], json.loads(fields["data"])) for _, fields in entries]


def _pending(tier: str = Tier.NORMAL) -> int:
    return sync_redis().xpending(keys.queue(MODEL, tier), keys.CONSUMER_GROUP)["pending"]


def _in_flight(client_id: str = "c1") -> int:
    return sync_redis().zcard(keys.inflight(client_id))


# --- how a job ends ---------------------------------------------------------------------------


def test_a_done_answer_is_stored_published_acknowledged_and_released():
    request_id = _submit()
    _serve(_worker(ScriptedEngine("Your ", "order ", "shipped.")))
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.text, answer.finish_reason) == ("done", "Your order shipped.", "stop")
    assert (answer.prompt_tokens, answer.completion_tokens, answer.engine) == (5, 3, "scripted")
    assert answer.ttft_ms is not None and answer.finished_at is not None
    events = _events(request_id)
    assert [kind for kind, _ in events] == ["queued", "start", "token", "done"]
    # The three steps came before the first write was out: they went as one event of three tokens.
    assert events[2][1] == {"seq": 0, "text": "Your order shipped.", "tokens": 3}
    assert (_pending(), _in_flight()) == (0, 0)


KLARNA = GroundingSource(
    "paying-in-instalments",
    "Paying in instalments with Klarna",
    ("Orders from $35 to $1,000 can be paid in 4 interest-free instalments with Klarna.",),
)


def _submit_verified(**changes: Any) -> str:
    grounding = Grounding(
        question="What can I pay with Klarna?", language="en", sources=(KLARNA,), decline="DECLINE"
    )
    job = dataclasses.replace(
        generation_job(disconnect_grace_s=10.0, max_tokens=64), grounding=grounding, **changes
    )
    request_submit(job=job)
    return job.request_id


def test_a_verified_answer_shows_each_sentence_once_checked_and_replaces_an_invented_one():
    request_id = _submit_verified()
    engine = ScriptedEngine(
        "Orders up to ", "$1,000 can be paid with Klarna. ", "With Klarna the maximum is ", "$100. ", "Thanks"
    )
    _serve(_worker(engine))
    answer = Generation.objects.get(request_id=request_id)
    expected = f"Orders up to $1,000 can be paid with Klarna. {KLARNA.sentences[0]} Thanks"
    assert (answer.status, answer.text) == ("done", expected)  # "$100" never reached the stream
    events = _events(request_id)
    texts = [data["text"] for kind, data in events if kind == "token"]
    assert "".join(texts) == expected and not any("$100" in text for text in texts)
    assert sum(data["tokens"] for kind, data in events if kind == "token") == 5  # every token counted
    kind, done = events[-1]
    report = {"style": "verified", "checked": 3, "replaced": 1, "dropped": 0, "declined": ""}
    assert (kind, done["grounding"]) == ("done", report)
    assert answer.grounding == report


def test_a_verified_answer_of_which_nothing_holds_is_the_decline_and_ends_at_a_sentence():
    request_id = _submit_verified()
    engine = ScriptedEngine("We have a 10% military discount for veterans in every state. ", "And also")
    _serve(_worker(engine))
    answer = Generation.objects.get(request_id=request_id)
    # "And also" says nothing: the answer is the decline after it.
    assert answer.text == "And also\n\nDECLINE" and answer.grounding["declined"] == "unsupported"


def test_a_job_cancelled_before_it_started_never_reaches_the_engine():
    request_id = _submit()
    control.request_cancel(request_id=request_id)
    engine = ScriptedEngine("never ")
    _serve(_worker(engine))
    assert not engine.wrote_all.is_set()
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.text, answer.finish_reason) == ("cancelled", "", "cancelled")
    assert _events(request_id)[-1] == ("done", {"finish_reason": "cancelled", "usage": {
        "prompt_tokens": 0, "completion_tokens": 0}, "timings": {}, "cached": False})  # fmt: skip
    assert (_pending(), _in_flight()) == (0, 0)


def test_a_job_cancelled_mid_answer_keeps_what_was_written():
    request_id = _submit()
    engine = ScriptedEngine("Half ", "an ", then=HANG)

    async def cancel_after_the_tokens(worker: InferenceWorker, job: Job) -> None:
        await engine.wrote_all.wait()
        worker.cancel(job.request_id)

    _serve(_worker(engine), before=cancel_after_the_tokens)
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.text, answer.finish_reason) == ("cancelled", "Half an ", "cancelled")
    assert _events(request_id)[-1][0] == "done"
    assert (_pending(), _in_flight()) == (0, 0)


def test_a_stop_that_comes_while_the_answer_is_being_stored_changes_nothing(monkeypatch):
    """The customer's stop arrives after the last token, while the answer is being stored: too
    late to cancel it. It ends `done` as written, and its slot and place are given back."""
    request_id = _submit()
    storing, release = threading.Event(), threading.Event()
    store = outcomes_module.generations_finish

    def slow_store(finished):
        storing.set()
        release.wait(10)
        return store(finished)

    monkeypatch.setattr(outcomes_module, "generations_finish", slow_store)
    worker = _worker(ScriptedEngine("Your ", "order ", "shipped."))

    async def stop_while_storing(worker: InferenceWorker, job: Job) -> None:
        await asyncio.to_thread(storing.wait, 10)
        worker.cancel(job.request_id)
        release.set()

    _serve(worker, before=stop_while_storing)
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.text) == ("done", "Your order shipped.")
    assert _events(request_id)[-1][0] == "done"
    assert (_pending(), _in_flight(), worker.running) == (0, 0, {})


def test_a_job_that_waited_past_its_deadline_expires_without_running():
    request_id = _submit()
    engine = ScriptedEngine("late ")
    _serve(_worker(engine), adjust=lambda job: dataclasses.replace(job, deadline=time.time() - 1))
    assert not engine.wrote_all.is_set()
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.error_code) == ("error", "expired")
    assert _events(request_id)[-1][0] == "error"
    assert (_pending(), _in_flight()) == (0, 0)


def test_an_answer_over_the_generation_timeout_ends_with_a_timeout_error():
    request_id = _submit()
    _serve(_worker(ScriptedEngine("Slow ", then=HANG), generation_timeout_s=0.2))
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.error_code, answer.text) == ("error", "timeout", "Slow ")
    assert _events(request_id)[-1] == ("error", {"code": "timeout", "message": answer.error_message})
    assert (_pending(), _in_flight()) == (0, 0)


def test_a_request_the_engine_fails_ends_with_an_error_and_is_not_retried():
    request_id = _submit()
    _serve(_worker(ScriptedEngine("Bro", then=EngineRequestError("bad request"))))
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.error_code, answer.text) == ("error", "engine_error", "Bro")
    assert _events(request_id)[-1][0] == "error"
    assert (_pending(), _in_flight()) == (0, 0)


def test_a_dead_engine_drains_the_worker_and_leaves_the_job_for_another():
    request_id = _submit()
    worker = _worker(ScriptedEngine("Lost ", then=EngineDeadError("CUDA error")))
    _serve(worker)
    assert worker.draining and isinstance(worker.fatal, EngineDeadError)
    assert request_id in worker.running  # handed back to the queue when the worker stops
    assert Generation.objects.get(request_id=request_id).status == "pending"
    assert _events(request_id)[-1][0] == "token"  # no end: the next worker resets and restarts
    assert (_pending(), _in_flight()) == (1, 1)


def test_an_engine_that_dies_with_nothing_running_stops_the_worker_at_its_next_heartbeat():
    """vLLM's engine core killed while the worker waits for work: the worker must not wait for
    a customer's job to find its engine dead, but exit with the error, for its launcher to
    replace."""
    engine = ScriptedEngine()
    worker = _worker(engine, heartbeat_s=0.05)

    def dead_stats() -> EngineStats:
        raise EngineDeadError("the engine core has died")

    async def scenario() -> None:
        running = asyncio.create_task(worker.run())
        await _until(lambda: _heartbeat(worker) != {}, "the worker's first heartbeat")
        engine.stats = dead_stats
        done, _ = await asyncio.wait([running], timeout=10.0)
        assert done, "the worker went on with a dead engine"
        with pytest.raises(EngineDeadError):
            running.result()

    asyncio.run(scenario())
    assert _heartbeat(worker) == {}  # it left the registry: no job is routed to it


def test_a_job_reclaimed_after_its_worker_died_mid_answer_restarts_with_a_reset():
    request_id = _submit()
    # The dead worker's start and first token are in the stream.
    sync_redis().xadd(keys.result(MODEL, request_id), {"type": "start", "data": json.dumps({"attempt": 1})})
    sync_redis().xadd(
        keys.result(MODEL, request_id), {"type": "token", "data": json.dumps({"seq": 0, "text": "Old "})}
    )
    _serve(_worker(ScriptedEngine("New ", "answer.")), adjust=lambda job: dataclasses.replace(job, attempt=2))
    events = _events(request_id)
    assert [kind for kind, _ in events] == ["queued", "start", "token", "reset", "start", "token", "done"]
    assert events[5][1] == {"seq": 0, "text": "New answer.", "tokens": 2}
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.text) == ("done", "New answer.")
    assert (_pending(), _in_flight()) == (0, 0)


def test_a_job_finished_before_its_worker_could_acknowledge_it_is_only_acknowledged():
    request_id = _submit()
    # Its first worker stored and published the answer, then died before acknowledging.
    generation_finish(
        request_id=request_id, outcome=GenerationOutcome(status=Generation.Status.DONE, text="Once.")
    )
    sync_redis().xadd(
        keys.result(MODEL, request_id), {"type": "done", "data": json.dumps({"finish_reason": "stop"})}
    )
    events = _events(request_id)
    engine = ScriptedEngine("Twice.")
    _serve(_worker(engine), adjust=lambda job: dataclasses.replace(job, attempt=2))
    assert not engine.wrote_all.is_set()
    assert _events(request_id) == events
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.text) == ("done", "Once.")
    assert _pending() == 0


def _with_queue(worker: InferenceWorker, body: Callable[[], Awaitable[Any]]) -> Any:
    """Run `body` with the worker's queue and publisher set up as `run()` sets them."""

    async def scenario() -> Any:
        client = new_async_redis()
        worker.connect(client)
        publishing = asyncio.create_task(worker.publisher.run())
        try:
            await worker.queue.ensure_groups()
            return await body()
        finally:
            publishing.cancel()
            await client.aclose()

    return async_to_sync(scenario)()


def test_a_job_out_of_attempts_is_dead_lettered_and_its_client_told():
    request_id = _submit()
    worker = _worker(ScriptedEngine("never "), lease_s=0.3, max_attempts=1)

    async def a_dead_worker_held_it_then_the_lease_loop_runs() -> None:
        dead = JobQueue(worker.queue.client, model=MODEL, consumer="dead-worker")
        await dead.claim(total=1, per_tier=dict.fromkeys(Tier, 1))  # its first and only attempt
        upkeep = asyncio.create_task(worker._lease_loop())
        try:
            await _until(lambda: _events(request_id)[-1][0] == "error", "the client told")
        finally:
            upkeep.cancel()

    _with_queue(worker, a_dead_worker_held_it_then_the_lease_loop_runs)
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.error_code) == ("error", "failed")
    assert _events(request_id)[-1] == ("error", {"code": "failed", "message": answer.error_message})
    [(_, letter)] = sync_redis().xrange(keys.dead_letter(MODEL))
    assert (letter["request_id"], letter["reason"], letter["attempts"]) == (request_id, "max_attempts", "1")
    assert (_pending(), _in_flight(), worker.running) == (0, 0, {})


def test_a_draining_worker_hands_an_unfinished_answer_back_to_the_queue():
    request_id = _submit()
    engine = ScriptedEngine("Half ", then=HANG)
    worker = _worker(engine, drain_timeout_s=0.2)

    async def start_then_drain() -> list[Job]:
        [job] = await worker.queue.claim(total=1, per_tier=dict.fromkeys(Tier, 1))
        await worker._start_jobs([job])
        await engine.wrote_all.wait()
        worker.drain()
        await worker._finish_running()
        other = JobQueue(worker.queue.client, model=MODEL, consumer="another-worker")
        runnable, exhausted = await other.reclaim_expired(lease_s=30.0, max_count=1, max_attempts=1)
        assert exhausted == []
        return runnable

    [taken_over] = _with_queue(worker, start_then_drain)
    # At once, not after the lease, and not counted as a failed attempt.
    assert (taken_over.request_id, taken_over.attempt) == (request_id, 1)
    assert Generation.objects.get(request_id=request_id).status == "pending"
    assert _events(request_id)[-1][0] == "token"  # no end: the next worker resets and restarts


def test_a_job_that_fails_unexpectedly_frees_its_slot_and_waits_for_its_lease():
    request_id = _submit()
    worker = _worker(ScriptedEngine("Oops ", then=RuntimeError("a bug")))
    _serve(worker)
    assert worker.running == {}  # its slot is free for the next job
    assert Generation.objects.get(request_id=request_id).status == "pending"
    assert _events(request_id)[-1][0] == "token"
    assert _pending() == 1  # unacknowledged: taken over after its lease, up to max_attempts


def test_a_stopping_worker_gives_up_on_redis_at_its_deadline_and_a_serving_one_waits_it_out():
    import redis

    from inference.stopping import RedisGaveUp

    failures = 0

    async def redis_down_for_three_tries() -> str:
        nonlocal failures
        failures += 1
        if failures <= 3:
            raise redis.ConnectionError("down")
        return "written"

    async def never_up() -> str:
        raise redis.ConnectionError("down")

    async def scenario() -> tuple[str, float]:
        worker = _worker(ScriptedEngine())
        written = await worker.retry(redis_down_for_three_tries)
        loop = asyncio.get_running_loop()
        worker.retry.give_up_at = loop.time() + 0.3  # as drain() sets it
        started = loop.time()
        with pytest.raises(RedisGaveUp):
            await worker.retry(never_up)
        return written, loop.time() - started

    written, gave_up_after_s = asyncio.run(scenario())
    assert (written, failures) == ("written", 4)
    assert gave_up_after_s < 5.0  # at its deadline, not after Redis's own retries


def test_a_draining_worker_stops_even_when_a_call_swallows_the_cancel_of_its_heartbeat(monkeypatch):
    """Seen with real Redis and database calls: a cancel caught inside a library call, and the
    loop around it went on; the worker's run() then waited for that loop forever."""
    from inference import worker as worker_module

    heartbeat_write = worker_module.workers.heartbeat_write
    entered, swallowed = asyncio.Event(), asyncio.Event()

    async def swallowing_heartbeat_write(client, **kwargs) -> None:
        if swallowed.is_set():
            return await heartbeat_write(client, **kwargs)
        entered.set()
        try:
            await asyncio.sleep(3600)  # a call the cancel reaches
        except asyncio.CancelledError:
            swallowed.set()  # and that catches it, as a library call did

    monkeypatch.setattr(worker_module.workers, "heartbeat_write", swallowing_heartbeat_write)
    worker = _worker(ScriptedEngine(), heartbeat_s=0.05)

    async def scenario() -> None:
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(entered.wait(), 10.0)
        worker.drain()
        done, _ = await asyncio.wait([running], timeout=10.0)
        assert done, "the worker did not stop"
        running.result()

    asyncio.run(scenario())
    assert swallowed.is_set()
    assert _heartbeat(worker) == {}  # and it stopped as it should: it left the registry


def test_a_second_finish_of_the_same_generation_changes_nothing():
    request_id = _submit()
    _serve(_worker(ScriptedEngine("First.")))
    replayed = GenerationOutcome(status=Generation.Status.ERROR, error_code="failed", error_message="...")
    assert generation_finish(request_id=request_id, outcome=replayed) is False
    answer = Generation.objects.get(request_id=request_id)
    assert (answer.status, answer.text) == ("done", "First.")


# --- what may start --------------------------------------------------------------------------


def _running(worker: InferenceWorker, *tiers: str) -> None:
    for n, tier in enumerate(tiers):
        generation = generation_job(f"r{n}", tier=tier)
        job = Job(
            entry_id=f"0-{n}",
            model=MODEL,
            tier=tier,
            request_id=f"r{n}",
            seq=n,
            enqueued_at=0.0,
            deadline=0.0,
            generation=generation,
            share=FairShare.of(generation),
        )
        worker.running[job.request_id] = Answer(job=job)


def test_normal_and_batch_work_leave_the_vip_reserve_free():
    worker = _worker(ScriptedEngine(), vip_reserved_slots=1, batch_max_slots=2)  # 4 slots
    assert worker.slots.room() == {Tier.VIP: 4, Tier.NORMAL: 3, Tier.BATCH: 2}
    _running(worker, Tier.NORMAL, Tier.NORMAL)
    assert worker.slots.room() == {Tier.VIP: 2, Tier.NORMAL: 1, Tier.BATCH: 1}
    _running(worker, Tier.NORMAL, Tier.NORMAL, Tier.NORMAL)
    assert worker.slots.room() == {Tier.VIP: 1, Tier.NORMAL: 0, Tier.BATCH: 0}


def test_vip_work_does_not_use_up_the_room_of_normal_work_beyond_the_slots():
    worker = _worker(ScriptedEngine(), vip_reserved_slots=1, batch_max_slots=2)
    _running(worker, Tier.VIP, Tier.VIP)
    assert worker.slots.room() == {Tier.VIP: 2, Tier.NORMAL: 2, Tier.BATCH: 2}
    _running(worker, Tier.VIP, Tier.VIP, Tier.BATCH, Tier.BATCH)
    assert worker.slots.room() == {Tier.VIP: 0, Tier.NORMAL: 0, Tier.BATCH: 0}


def test_batch_work_holds_at_most_its_share_of_slots():
    worker = _worker(ScriptedEngine(), vip_reserved_slots=0, batch_max_slots=2)
    _running(worker, Tier.BATCH, Tier.BATCH)
    assert worker.slots.room() == {Tier.VIP: 2, Tier.NORMAL: 2, Tier.BATCH: 0}


def test_a_normal_job_waiting_past_the_aging_time_goes_before_vip():
    normal = _submit(Tier.NORMAL)
    vip = _submit(Tier.VIP)

    async def claim(aging_s: float | None) -> list[str]:
        client = new_async_redis()
        try:
            queue = JobQueue(client, model=MODEL, consumer="w")
            await queue.ensure_groups()
            jobs = await queue.claim(total=1, per_tier=dict.fromkeys(Tier, 1), aging_s=aging_s)
            return [job.request_id for job in jobs]
        finally:
            await client.aclose()

    assert async_to_sync(claim)(aging_s=30.0) == [vip]  # nobody has waited long: VIP first
    other_vip = _submit(Tier.VIP)
    assert async_to_sync(claim)(aging_s=0.0) == [normal]  # the normal job has waited past 0 s
    assert async_to_sync(claim)(aging_s=0.0) == [other_vip]


# --- preempting for VIP ----------------------------------------------------------------------


def _entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])


def _generating(worker: InferenceWorker, *tiers: str) -> list[Answer]:
    """Answers being written, started one second apart in the order given."""
    _running(worker, *tiers)
    entries = list(worker.running.values())
    for n, entry in enumerate(entries):
        entry.started_at = float(n)
        entry.preemptible = entry.job.tier != Tier.VIP
    return entries


def test_a_vip_job_preempts_the_youngest_normal_answer():
    worker = _worker(ScriptedEngine(), vip_reserved_slots=1)
    _, older, younger, _ = _generating(worker, Tier.VIP, Tier.NORMAL, Tier.NORMAL, Tier.VIP)
    assert worker.slots.preemption_victim() is younger
    younger.paused = True  # a paused answer holds no slot and is not taken twice
    assert worker.slots.preemption_victim() is older
    assert worker.slots.room()[Tier.VIP] == 1


def test_batch_work_is_preempted_before_any_normal_answer():
    worker = _worker(ScriptedEngine(), vip_reserved_slots=0)
    batch, _younger_normal, _, _ = _generating(worker, Tier.BATCH, Tier.NORMAL, Tier.VIP, Tier.VIP)
    assert worker.slots.preemption_victim() is batch


def test_vip_answers_cancelled_answers_and_structured_outputs_are_never_preempted():
    worker = _worker(ScriptedEngine(), vip_reserved_slots=0)
    _, cancelled, structured, _ = _generating(worker, Tier.VIP, Tier.NORMAL, Tier.NORMAL, Tier.VIP)
    cancelled.cancel_requested = True
    structured.job = dataclasses.replace(
        structured.job,
        generation=dataclasses.replace(
            structured.job.generation,
            sampling=SamplingParams(max_tokens=16, temperature=0.0, top_p=1.0, structured=StructuredOutput()),
        ),
    )
    assert worker.slots.preemption_victim() is None


def test_answers_that_would_not_resume_as_they_were_are_never_preempted():
    worker = _worker(ScriptedEngine(), vip_reserved_slots=0)
    _, seeded, penalised, _ = _generating(worker, Tier.VIP, Tier.NORMAL, Tier.NORMAL, Tier.VIP)
    for entry, sampling in [
        (seeded, SamplingParams(max_tokens=16, temperature=0.7, top_p=1.0, seed=7)),
        (penalised, SamplingParams(max_tokens=16, temperature=0.0, top_p=1.0, frequency_penalty=0.5)),
    ]:
        entry.job = dataclasses.replace(
            entry.job, generation=dataclasses.replace(entry.job.generation, sampling=sampling)
        )
    # A frequency penalty resumes as it was (the engine counts the tokens written before the
    # pause): that answer is the one paused; a presence penalty would not.
    assert worker.slots.preemption_victim() is penalised
    penalised.job = dataclasses.replace(
        penalised.job,
        generation=dataclasses.replace(
            penalised.job.generation,
            sampling=SamplingParams(max_tokens=16, temperature=0.0, top_p=1.0, presence_penalty=0.5),
        ),
    )
    assert worker.slots.preemption_victim() is None
    # Greedy decoding ignores the seed: that answer resumes as it was.
    seeded.job = dataclasses.replace(
        seeded.job,
        generation=dataclasses.replace(
            seeded.job.generation, sampling=SamplingParams(max_tokens=16, temperature=0.0, top_p=1.0, seed=7)
        ),
    )
    assert worker.slots.preemption_victim() is seeded


def test_without_vip_preemption_nothing_is_preempted():
    worker = _worker(ScriptedEngine(), vip_preemption=False)
    _generating(worker, Tier.NORMAL, Tier.NORMAL, Tier.NORMAL, Tier.NORMAL)
    assert worker.slots.preemption_victim() is None


VIP_AFTER_NORMAL_TOKENS = 16


def _one_slot_worker(*, answer_s: float, vip_preempt_after_s: float) -> InferenceWorker:
    """One slot, VIP reserving none; each answer is 16 tokens over `answer_s`."""
    engine = SimulatedEngine(
        max_num_seqs=1,
        prefill_s_per_token=0.0,
        decode_base_s=answer_s / VIP_AFTER_NORMAL_TOKENS,
        decode_per_seq_s=0.0,
        output_tokens=VIP_AFTER_NORMAL_TOKENS,
    )
    return _worker(engine, vip_reserved_slots=0, heartbeat_s=0.2, vip_preempt_after_s=vip_preempt_after_s)


def _kinds(request_id: str) -> list[str]:
    return [kind for kind, _ in _events(request_id)]


def _vip_queued_after_normal(
    worker: InferenceWorker, then: Callable[[str, str], Awaitable[None]]
) -> tuple[str, str]:
    """Run the worker; queue a normal job, and a VIP job once the normal answer is under way;
    `then(normal, vip)` waits for what the test looks at. Returns (normal, vip) request ids once
    the normal answer is done and the worker has drained."""
    normal = _submit(Tier.NORMAL)

    async def scenario() -> str:
        running = asyncio.create_task(worker.run())
        try:
            await _until(lambda: _kinds(normal).count("token") >= 2, "the normal answer to be under way")
            vip = await sync_to_async(_submit)(Tier.VIP)
            await then(normal, vip)
            await _until(lambda: _kinds(normal)[-1:] == ["done"], "the normal answer")
            return vip
        finally:
            worker.drain()
            await running

    return normal, async_to_sync(scenario)()


def _vip_after_normal(*, answer_s: float, vip_preempt_after_s: float) -> tuple[str, str]:
    """One slot, held by a normal answer of `answer_s`; a VIP job queued once it is under way.
    Returns (normal, vip) request ids once both answers are done."""

    async def vip_done(normal: str, vip: str) -> None:
        await _until(lambda: _kinds(vip)[-1:] == ["done"], "the VIP answer")

    worker = _one_slot_worker(answer_s=answer_s, vip_preempt_after_s=vip_preempt_after_s)
    return _vip_queued_after_normal(worker, vip_done)


def test_a_vip_job_on_a_full_worker_starts_at_once_and_the_paused_answer_goes_on_where_it_was():
    """One slot, held by a normal answer: the VIP job takes it before the answer ends, and
    the normal answer then finishes once, its text whole, with no token twice and no reset."""
    tokens = VIP_AFTER_NORMAL_TOKENS
    normal, vip = _vip_after_normal(answer_s=0.8, vip_preempt_after_s=0.0)
    normal_events = _events(normal)
    vip_events = _events(vip)
    # The VIP answer had its first token before the normal one ended: the one slot was its.
    first_vip_token = next(n for n, (kind, _) in enumerate(vip_events) if kind == "token")
    vip_entry_ids = [entry_id for entry_id, _ in sync_redis().xrange(keys.result(MODEL, vip))]
    normal_done_id = sync_redis().xrange(keys.result(MODEL, normal))[-1][0]
    assert _entry_ms(vip_entry_ids[first_vip_token]) < _entry_ms(normal_done_id)
    assert "reset" not in _kinds(normal)
    normal_tokens = [data for kind, data in normal_events if kind == "token"]
    assert [t["seq"] for t in normal_tokens] == list(range(tokens))
    job = generation_job(normal)
    expected = "".join(simulated_answer_tokens(GenerationRequest(normal, job.messages, job.sampling), tokens))
    assert "".join(t["text"] for t in normal_tokens) == expected
    answer = Generation.objects.get(request_id=normal)
    assert (answer.status, answer.text, answer.completion_tokens) == ("done", expected, tokens)
    assert _kinds(normal).count("done") == 1 and _kinds(normal).count("start") == 1
    assert (_pending(Tier.NORMAL), _pending(Tier.VIP)) == (0, 0)


def _first_token_ms(request_id: str) -> float:
    entries = sync_redis().xrange(keys.result(MODEL, request_id))
    return _entry_ms(next(entry_id for entry_id, fields in entries if fields["type"] == "token"))


def _done_ms(request_id: str) -> float:
    return _entry_ms(sync_redis().xrange(keys.result(MODEL, request_id))[-1][0])


def _preemptions() -> float:
    """Answers paused for a VIP job in this process so far (the counter is process-wide)."""
    return sum(sample.value for sample in PREEMPTIONS.collect()[0].samples if sample.name.endswith("_total"))


def test_a_vip_job_waits_out_its_grace_for_a_slot_to_turn_over_and_pauses_nothing():
    before = _preemptions()
    normal, vip = _vip_after_normal(answer_s=0.8, vip_preempt_after_s=30.0)
    assert _first_token_ms(vip) > _done_ms(normal)  # it took the slot the normal answer left
    assert _preemptions() == before
    assert _kinds(normal).count("start") == 1
    assert (_pending(Tier.NORMAL), _pending(Tier.VIP)) == (0, 0)


def test_a_vip_job_whose_grace_runs_out_pauses_the_normal_answer():
    before = _preemptions()
    normal, vip = _vip_after_normal(answer_s=4.0, vip_preempt_after_s=0.2)
    assert _first_token_ms(vip) < _done_ms(normal)
    assert _preemptions() == before + 1
    assert Generation.objects.get(request_id=normal).status == "done"


def test_a_vip_job_cancelled_while_it_waits_out_its_grace_ends_at_once_and_pauses_nothing():
    before = _preemptions()
    worker = _one_slot_worker(answer_s=4.0, vip_preempt_after_s=30.0)

    async def cancel_while_held(normal: str, vip: str) -> None:
        await _until(lambda: _pending(Tier.VIP) == 1, "the worker to claim the VIP job and hold it")
        await _until(lambda: _heartbeat(worker).get("vip_waiting") is True, "its heartbeat to show it")
        assert _heartbeat(worker)["running"] == 1
        worker.cancel(vip)
        await _until(lambda: _events(vip)[-1][0] == "done", "the cancelled VIP job to end")
        assert _events(normal)[-1][0] == "token"  # the normal answer was still being written
        await _until(lambda: _heartbeat(worker).get("vip_waiting") is False, "its heartbeat to show none")

    normal, vip = _vip_queued_after_normal(worker, cancel_while_held)
    assert _events(vip)[-1][1]["finish_reason"] == "cancelled"
    assert "token" not in _kinds(vip)
    assert Generation.objects.get(request_id=vip).status == "cancelled"
    assert _preemptions() == before
    assert Generation.objects.get(request_id=normal).status == "done"
    assert (_pending(Tier.NORMAL), _pending(Tier.VIP)) == (0, 0)


def _fair_share_preemptions() -> float:
    return sum(
        sample.value
        for sample in FAIR_SHARE_PREEMPTIONS.collect()[0].samples
        if sample.name.endswith("_total")
    )


def _customer_after_flood(*, fair_share_preemption: bool) -> tuple[list[str], str]:
    """Two slots, both held by a key's long answers with two more of its jobs waiting; a chat
    customer's job queued once they are under way. Returns (the key's, the customer's) request
    ids once every answer is done."""
    engine = SimulatedEngine(
        max_num_seqs=2, prefill_s_per_token=0.0, decode_base_s=0.05, decode_per_seq_s=0.0, output_tokens=40
    )
    worker = _worker(engine, vip_reserved_slots=0, fair_share_preemption=fair_share_preemption)
    TierPolicy.objects.filter(tier=Tier.NORMAL).update(max_concurrent_per_user=4)
    policies_mirror()
    flood = []
    for _ in range(4):
        job = generation_job(client_id="key:flood", origin=Origin.API, disconnect_grace_s=30.0, max_tokens=64)
        request_submit(job=job)
        flood.append(job.request_id)

    async def scenario() -> str:
        running = asyncio.create_task(worker.run())
        try:
            await _until(lambda: all(_kinds(r).count("token") >= 2 for r in flood[:2]), "the key's answers")
            customer = generation_job(client_id="guest:a", disconnect_grace_s=30.0)
            await sync_to_async(request_submit)(job=customer)
            await _until(
                lambda: all(_kinds(r)[-1:] == ["done"] for r in [*flood, customer.request_id]), "all"
            )
            return customer.request_id
        finally:
            worker.drain()
            await running

    return flood, async_to_sync(scenario)()


def test_a_customer_under_its_share_pauses_the_flooding_key_s_youngest_answer():
    before = _fair_share_preemptions()
    flood, customer = _customer_after_flood(fair_share_preemption=True)
    assert _first_token_ms(customer) < min(_done_ms(r) for r in flood[:2])  # no long answer ended first
    assert _first_token_ms(customer) < _first_token_ms(flood[2])  # nor did the key's next job go first
    assert _fair_share_preemptions() == before + 1
    for request_id in flood:  # the paused answer went on where it was: each whole, once
        answer = Generation.objects.get(request_id=request_id)
        assert (answer.status, answer.completion_tokens) == ("done", 40)
        assert "reset" not in _kinds(request_id)


def test_without_fair_share_preemption_the_customer_takes_the_next_slot_to_turn_over():
    before = _fair_share_preemptions()
    flood, customer = _customer_after_flood(fair_share_preemption=False)
    assert _first_token_ms(customer) > min(_done_ms(r) for r in flood[:2])
    assert _first_token_ms(customer) <= _first_token_ms(flood[2])  # not after the key's next job
    assert _fair_share_preemptions() == before


# --- affinity: a conversation's turns on one worker ------------------------------------------


def _turn(conversation: str) -> str:
    job = dataclasses.replace(generation_job(disconnect_grace_s=10.0), conversation_id=conversation)
    request_submit(job=job)
    return job.request_id


def _answered_by(request_id: str) -> str:
    return next(data["worker"] for kind, data in _events(request_id) if kind == "start")


def test_a_conversation_s_turns_go_to_the_worker_that_answered_its_first_until_it_drains(settings):
    settings.AFFINITY_WAIT_S = 30.0  # far longer than a turn takes: only affinity decides here

    def engine() -> SimulatedEngine:
        return SimulatedEngine(
            max_num_seqs=4, prefill_s_per_token=0.0, decode_base_s=0.01, decode_per_seq_s=0.0, output_tokens=4
        )

    workers = [_worker(engine(), vip_reserved_slots=0, heartbeat_s=0.1) for _ in range(2)]

    async def scenario() -> tuple[str, list[str], str]:
        running = [asyncio.create_task(worker.run()) for worker in workers]
        try:
            await _until(lambda: all(w.serving_workers == 2 for w in workers), "both to see the other serve")
            first = await sync_to_async(_turn)("conversation-a")
            await _until(lambda: _kinds(first)[-1:] == ["done"], "the first turn")
            later = []
            for _ in range(3):
                turn = await sync_to_async(_turn)("conversation-a")
                await _until(lambda turn=turn: _kinds(turn)[-1:] == ["done"], "a later turn")
                later.append(_answered_by(turn))
            owner = next(w for w in workers if w.worker_id == _answered_by(first))
            owner.drain()
            after_drain = await sync_to_async(_turn)("conversation-a")
            # Well within the 30 s it would be left to a serving worker.
            await _until(lambda: _kinds(after_drain)[-1:] == ["done"], "the turn after the drain")
            return _answered_by(first), later, _answered_by(after_drain)
        finally:
            for worker in workers:
                worker.drain()
            await asyncio.gather(*running)

    first, later, after_drain = async_to_sync(scenario)()
    assert later == [first] * 3
    assert after_drain != first


# --- the warm pool ------------------------------------------------------------------------------


async def _until(condition: Callable[[], Any], what: str, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return value


def _heartbeat(worker: InferenceWorker) -> dict:
    raw = sync_redis().get(keys.worker_heartbeat(worker.worker_id))
    return json.loads(raw) if raw else {}


def test_a_spare_claims_nothing_and_adds_no_capacity_until_it_is_needed():
    WarmPool.objects.update_or_create(pk=1, defaults={"spares": 1})
    spares_mirror()
    request_id = _submit()
    worker = _worker(ScriptedEngine("Hello", " there"), heartbeat_s=0.1)

    def capacity() -> str:
        return sync_redis().hget(keys.capacity(MODEL), worker.worker_id) or ""

    async def scenario() -> None:
        client = new_async_redis()
        # Another worker already serves, and no traffic asks for a second one.
        await serving_decide(client, model=MODEL, worker_id="serving-1", needed=1)
        running = asyncio.create_task(worker.run())
        try:
            await _until(lambda: _heartbeat(worker).get("spare"), "the worker to report itself a spare")
            await _until(lambda: capacity().startswith("0.0|0.0|"), "its capacity to read nothing")
            seen = _heartbeat(worker)["last_seen"]
            beats = 0

            def heartbeats_later() -> bool:
                nonlocal seen, beats
                if _heartbeat(worker)["last_seen"] != seen:
                    seen, beats = _heartbeat(worker)["last_seen"], beats + 1
                return beats >= 3

            await _until(heartbeats_later, "three more heartbeats as a spare")
            assert _pending() == 0 and _events(request_id)[-1][0] == "queued"
            # The serving worker stops: the spare takes its place and answers.
            await serving_leave(client, model=MODEL, worker_id="serving-1")
            await _until(lambda: _events(request_id)[-1][0] == "done", "the former spare to answer")
            await _until(lambda: not _heartbeat(worker)["spare"], "its heartbeat to say it serves")
        finally:
            worker.drain()
            await running
            await client.aclose()

    async_to_sync(scenario)()
