"""The inference worker: claim jobs while there are free sequence slots, run them through the
engine, publish their tokens, store the answers, and keep the registry told that it is alive.

One worker process serves one model, and with it every variant on that model: a job carries
its variant's prompt and sampling, so the worker needs nothing else to answer it. Claims go VIP
first; `vip_reserved_slots` slots are never filled with normal traffic, and a VIP job that finds
every slot busy preempts the youngest normal (or batch) answer, which pauses and later continues
from the text it had streamed. Jobs are acknowledged only after the answer is stored, so a
worker that dies leaves its jobs pending, and another worker takes them over once their lease
runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import redis
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError

from inference import metrics as worker_metrics
from inference.engines import build_engine
from inference.engines.base import (
    Continuation,
    Delta,
    Engine,
    EngineDeadError,
    EngineRequestError,
    GenerationRequest,
    resumable,
)
from knowledge.grounding import AnswerChecker
from scheduler import control, keys, timeseries, warmpool, workers
from scheduler.admission import request_finished
from scheduler.fair_share import fair_share_settle
from scheduler.generation import (
    TERMINAL_EVENTS,
    Done,
    Error,
    EventBody,
    ParsedAnswer,
    Queued,
    Reset,
    Start,
    Tier,
    Timings,
    Token,
    Usage,
)
from scheduler.models import Generation
from scheduler.queues import Job, JobQueue
from scheduler.redis import async_redis
from scheduler.results import ResultPublisher, abandoned_request_ids
from scheduler.rules import lease_renewal_s
from scheduler.services import GenerationOutcome, generations_finish

logger = logging.getLogger(__name__)

REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError)
# After the drain timeout, how long a stopping worker keeps trying to hand jobs back and leave
# the registry before it exits anyway: what it could not hand back is taken over after its
# lease, as after a crash.
HAND_BACK_S = 5.0
# With every slot busy, how often the worker looks for a VIP job to preempt for: the longest a
# VIP job waits before it starts. A non-blocking claim, so a slot that frees is reused at once.
VIP_PREEMPT_POLL_S = 0.05
# With answers under way, how long a claim that found nothing blocks for a new job before it
# looks again: a slot that frees meanwhile is filled within this (an idle worker blocks 1 s).
BUSY_CLAIM_BLOCK_S = 0.05
# Which answers a VIP job preempts first: batch, then normal.
_PREEMPT_ORDER = {Tier.BATCH: 0, Tier.NORMAL: 1}
# How long a stopping worker waits for a cancelled task to end before it cancels it again.
CANCEL_AGAIN_S = 0.1


class RedisGaveUp(Exception):
    """A stopping worker stopped waiting for Redis."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    model: str  # the model's serving name: this worker claims the jobs queued for it
    vip_reserved_slots: int
    lease_s: float
    max_attempts: int
    generation_timeout_s: float
    heartbeat_s: float
    drain_timeout_s: float
    service_time_prior_s: float
    normal_aging_s: float
    batch_max_slots: int
    vip_preemption: bool
    # How long a VIP job that finds every slot busy waits for one to turn over before an answer
    # is paused for it (0: at once).
    vip_preempt_after_s: float = 0.0
    # With every slot busy, pause the youngest answer of the source holding the most slots
    # (more than its even part) for a waiting job of a source served less (fair share).
    fair_share_preemption: bool = False

    @classmethod
    def from_settings(cls) -> WorkerConfig:
        return cls(
            model=settings.INFERENCE_MODEL_NAME,
            vip_reserved_slots=settings.VIP_RESERVED_SLOTS,
            lease_s=settings.JOB_LEASE_S,
            max_attempts=settings.JOB_MAX_ATTEMPTS,
            generation_timeout_s=settings.GENERATION_TIMEOUT_S,
            heartbeat_s=settings.WORKER_HEARTBEAT_S,
            drain_timeout_s=settings.WORKER_DRAIN_TIMEOUT_S,
            service_time_prior_s=settings.SERVICE_TIME_PRIOR_S,
            normal_aging_s=settings.NORMAL_AGING_S,
            batch_max_slots=settings.BATCH_MAX_SLOTS,
            vip_preemption=settings.VIP_PREEMPTION,
            vip_preempt_after_s=settings.VIP_PREEMPT_AFTER_S,
            fair_share_preemption=settings.FAIR_SHARE and settings.FAIR_SHARE_PREEMPTION,
        )


@dataclass(eq=False)
class _Running:
    job: Job
    started_at: float = 0.0  # loop time it first started: the youngest is preempted first
    task: asyncio.Task[None] | None = None
    cancel_requested: bool = False
    # The type of the latest event in its result stream when it was claimed: "queued" for a
    # fresh start (see _serve_job).
    previous_event: str | None = Queued.type
    text: list[str] = field(default_factory=list)
    # True only while the engine is writing it and it may be paused for a VIP job.
    preemptible: bool = False
    # Preempted: holds no slot until the claim loop resumes it (sets `resumed`).
    paused: bool = False
    preempted: bool = False  # its task is being cancelled to pause it, not to end it
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    # Its outcome is being stored and published: a cancel now comes too late to change it, and
    # a stopping worker waits for it rather than hand back an answer already stored.
    finishing: bool = False


@dataclass(eq=False)
class _HeldVip:
    """A VIP job claimed while every slot was busy, waiting out its grace for a slot to turn
    over (see InferenceWorker._claim_vip_over_victim)."""

    job: Job
    held_at: float  # loop time it was claimed
    cancelled: bool = False  # its customer cancelled it meanwhile: it starts at once, and ends

    def waited_s(self, now: float) -> float:
        """Since it was queued by the web's clock, and at least since it was claimed by ours:
        a web host's clock ahead of the worker's cannot stretch the grace."""
        return max(time.time() - self.job.enqueued_at, now - self.held_at)


class InferenceWorker:
    def __init__(self, engine: Engine, config: WorkerConfig) -> None:
        self.engine = engine
        self.config = config
        self.slots = engine.max_num_seqs
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.running: dict[str, _Running] = {}
        self.draining = False
        self.spare = False  # a warm spare: engine loaded, claiming nothing (scheduler/warmpool.py)
        self.serving_workers = 1  # the model's, as of the last heartbeat (this one among them)
        self.fatal: BaseException | None = None
        self.mean_service_s = config.service_time_prior_s  # smoothed over finished answers
        self._slot_freed = asyncio.Event()
        self._held_vip: _HeldVip | None = None
        self._stopped = asyncio.Event()
        self._give_up_at: float | None = None  # loop time; set by drain()
        self.recorder = _Recorder()

    @classmethod
    def from_settings(cls) -> InferenceWorker:
        return cls(build_engine(), WorkerConfig.from_settings())

    # --- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until drained or the engine dies (then raise EngineDeadError)."""
        client = async_redis()
        self.queue = JobQueue(client, model=self.config.model, consumer=self.worker_id)
        self.publisher = ResultPublisher(client)
        started = time.monotonic()
        await self.engine.start()
        logger.info(
            "worker %s: engine %s ready in %.1fs, %d slots (%d reserved for VIP), model %s",
            self.worker_id,
            self.engine.label,
            time.monotonic() - started,
            self.slots,
            self.config.vip_reserved_slots,
            self.config.model,
        )
        background: list[asyncio.Task] = []
        try:
            await self._retrying(self.queue.ensure_groups)
            await self._serving_update()
            background = [
                asyncio.create_task(coro, name=name)
                for name, coro in [
                    ("publisher", self.publisher.run()),
                    ("heartbeat", self._heartbeat_loop()),
                    ("warm pool", self._serving_loop()),
                    ("control", self._control_loop()),
                    ("leases", self._lease_loop()),
                    ("watch", self._watch_loop()),
                ]
            ]
            await self._claim_loop()
            # Draining: its conversations' next turns go to the other workers at once.
            await self._serving_update()
            await self._finish_running()
        except RedisGaveUp:
            logger.warning("worker %s: Redis unavailable while stopping; exiting anyway", self.worker_id)
        finally:
            for task in background:
                task.cancel()
            await _wait_for_cancelled(background, give_up_at=self._give_up_at)
            await self.queue.recordings_wait()
            with contextlib.suppress(RedisGaveUp):
                await self._retrying(
                    lambda: workers.heartbeat_remove(
                        client, worker_id=self.worker_id, model=self.config.model
                    )
                )
            await self.engine.shutdown()
        if self.fatal is not None:
            raise EngineDeadError(str(self.fatal)) from self.fatal

    def drain(self) -> None:
        """Stop claiming; running answers finish (up to the drain timeout), the rest go back."""
        if not self.draining:
            logger.info("worker %s: draining (%d running)", self.worker_id, len(self.running))
            loop = asyncio.get_running_loop()
            self._give_up_at = loop.time() + self.config.drain_timeout_s + HAND_BACK_S
        self.draining = True
        for entry in self.running.values():
            entry.paused = False  # paused answers finish within the drain too
            entry.resumed.set()
        self._stopped.set()
        self._slot_freed.set()

    async def _held_vip_release(self) -> None:
        """Hand the held VIP job back to its queue (stopping, or turned spare); without Redis it
        is taken over when its lease runs out, no longer renewed."""
        if self._held_vip is not None:
            held, self._held_vip = self._held_vip.job, None
            with contextlib.suppress(RedisGaveUp):
                await self._retrying(lambda: self.queue.release(held))

    async def _finish_running(self) -> None:
        await self._held_vip_release()
        tasks = [r.task for r in self.running.values() if r.task is not None]
        if tasks and self.fatal is None:
            await asyncio.wait(tasks, timeout=self.config.drain_timeout_s)
        # Those past the engine are storing their answer: handed back, they would run again
        # while the first answer stays the stored one.
        finishing = [r.task for r in self.running.values() if r.finishing and r.task is not None]
        if finishing and self._give_up_at is not None:
            remaining_s = self._give_up_at - asyncio.get_running_loop().time()
            await asyncio.wait(finishing, timeout=max(remaining_s, 0.0))
        kept = 0
        for entry in list(self.running.values()):
            try:
                await self._retrying(lambda job=entry.job: self.queue.release(job))
            except RedisGaveUp:
                kept += 1
            if entry.task is not None:
                entry.task.cancel()
        if kept:
            logger.warning(
                "worker %s: could not hand %d jobs back; they are taken over when their lease runs out",
                self.worker_id,
                kept,
            )
        await _wait_for_cancelled(
            [r.task for r in self.running.values() if r.task is not None], give_up_at=self._give_up_at
        )

    # --- claiming ----------------------------------------------------------------------------

    def _active(self) -> list[_Running]:
        """The answers holding a slot: running ones, not the paused."""
        return [r for r in self.running.values() if not r.paused]

    def _room(self) -> dict[Tier, int]:
        """How many more jobs of each tier may start now: VIP may use every free slot; normal
        and batch together leave `vip_reserved_slots` free; batch never holds more than
        `batch_max_slots`."""
        active = self._active()
        free = self.slots - len(active)
        not_vip = sum(1 for r in active if r.job.tier != Tier.VIP)
        batch = sum(1 for r in active if r.job.tier == Tier.BATCH)
        normal_room = max(0, min(free, self.slots - self.config.vip_reserved_slots - not_vip))
        return {
            Tier.VIP: free,
            Tier.NORMAL: normal_room,
            Tier.BATCH: max(0, min(normal_room, self.config.batch_max_slots - batch)),
        }

    async def _claim_loop(self) -> None:
        while not self.draining:
            held = self._held_vip
            if held is not None and (held.cancelled or len(self._active()) < self.slots):
                # A slot turned over while a VIP job waited for one: it takes it before a paused
                # answer resumes, and nothing is paused for it. (A cancelled one only ends.)
                self._held_vip = None
                await self._start_jobs([held.job])
                entry = self.running.get(held.job.request_id)
                if held.cancelled and entry is not None:
                    entry.cancel_requested = True  # before its task first runs
                continue
            if self.spare:
                await self._held_vip_release()
                self._slot_freed.clear()
                await self._wait(self._slot_freed, 1.0)
                continue
            self._resume_paused()
            free = self.slots - len(self._active())
            try:
                if free > 0:
                    jobs = await self._unless_stopped(self._claim(free))
                else:
                    self._slot_freed.clear()
                    jobs = await self._unless_stopped(self._claim_vip_over_victim())
                    if not jobs and self._held_vip is None:
                        jobs = await self._unless_stopped(self._claim_over_share())
                    if not jobs:
                        await self._wait(self._slot_freed, self._vip_wait_s())
                        continue
            except REDIS_ERRORS as exc:
                logger.warning("worker %s: claiming failed (%s); retrying", self.worker_id, exc)
                await self._wait(self._stopped, 0.5)
                continue
            await self._start_jobs(jobs)

    def _preemption_victim(self) -> _Running | None:
        """The answer a VIP job would take the slot of: batch before normal, and within a tier
        the youngest (it has the least to recompute, and one resumed, now old, is not taken
        again before the others). Only answers the engine can resume as they were are paused
        (`resumable`: never a structured output, a seeded sample or a penalised one)."""
        if not self.config.vip_preemption:
            return None
        candidates = [
            r
            for r in self._active()
            if r.preemptible and not r.cancel_requested and resumable(r.job.generation)
        ]
        if not candidates:
            return None
        return max(candidates, key=lambda r: (-_PREEMPT_ORDER[r.job.tier], r.started_at))

    def _may_preempt(self) -> bool:
        """Whether a VIP job could take a slot now or soon (an answer not yet under way becomes
        preemptible when its first engine request starts)."""
        return self.config.vip_preemption and any(
            r.job.tier != Tier.VIP and not r.cancel_requested and resumable(r.job.generation)
            for r in self._active()
        )

    def _vip_wait_s(self) -> float:
        """How long the claim loop waits for a slot to turn over before it looks again: until the
        held VIP job's grace runs out, or the time between looks for a waiting one."""
        if self._held_vip is not None:
            waited_s = self._held_vip.waited_s(asyncio.get_running_loop().time())
            left_s = self.config.vip_preempt_after_s - waited_s
            if left_s > 0:
                return min(VIP_PREEMPT_POLL_S, left_s)
            return VIP_PREEMPT_POLL_S  # the grace is over, and no answer can be paused yet
        if self._may_preempt() or self._over_share_victim() is not None:
            return VIP_PREEMPT_POLL_S
        return 1.0

    async def _claim_vip_over_victim(self) -> list[Job]:
        """Every slot is busy: claim one waiting VIP job and hold it; once it has waited
        `vip_preempt_after_s` since it was queued with no slot turning over, pause the victim to
        make room. (With every slot busy, a slot turns over every service time / slots on
        average: most VIP jobs get one within the grace, and no answer is paused for them.)"""
        victim = self._preemption_victim()
        if victim is None:
            return []
        now = asyncio.get_running_loop().time()
        if self._held_vip is None:
            claimed = await self.queue.claim(total=1, per_tier={Tier.VIP: 1, Tier.NORMAL: 0, Tier.BATCH: 0})
            if not claimed:
                return []
            self._held_vip = _HeldVip(claimed[0], held_at=now)
        if self._held_vip.waited_s(now) < self.config.vip_preempt_after_s:
            return []
        jobs, self._held_vip = [self._held_vip.job], None
        if victim.preemptible and not victim.cancel_requested:
            logger.info(
                "worker %s: %s paused for VIP %s", self.worker_id, victim.job.request_id, jobs[0].request_id
            )
            worker_metrics.PREEMPTIONS.labels(victim.job.generation.variant, victim.job.tier).inc()
            victim.paused = victim.preempted = True
            victim.preemptible = False
            assert victim.task is not None  # set when it started
            victim.task.cancel()
        # A victim that finished or was cancelled meanwhile freed its slot anyway.
        return jobs

    def _over_share_victim(self) -> _Running | None:
        """The youngest pausable answer of the source holding the most of this worker's slots,
        when it holds more than one and more than an even part (the slots over the sources
        holding them and one newcomer)."""
        if not self.config.fair_share_preemption:
            return None
        active = self._active()
        held = Counter(r.job.share.source for r in active)
        if not held:
            return None
        source, count = held.most_common(1)[0]
        if count <= 1 or count <= self.slots / (len(held) + 1):
            return None
        candidates = [
            r
            for r in active
            if r.job.share.source == source
            and r.job.tier != Tier.VIP
            and r.preemptible
            and not r.cancel_requested
            and resumable(r.job.generation)
        ]
        return max(candidates, key=lambda r: r.started_at, default=None)

    async def _claim_over_share(self) -> list[Job]:
        """Every slot is busy: claim a waiting job of the victim's tier whose source was served
        less than the victim's, and pause the victim for it (it resumes, as a VIP preemption's
        does, when a slot turns over). A source under its share then waits for no long answer
        to end."""
        victim = self._over_share_victim()
        if victim is None:
            return []
        jobs = await self.queue.claim(
            total=1, per_tier={victim.job.tier: 1}, under_share_of=victim.job.share.source
        )
        if not jobs:
            return []
        if victim.preemptible and not victim.cancel_requested:
            logger.info(
                "worker %s: %s paused for %s (fair share)",
                self.worker_id,
                victim.job.request_id,
                jobs[0].request_id,
            )
            worker_metrics.FAIR_SHARE_PREEMPTIONS.labels(victim.job.generation.variant, victim.job.tier).inc()
            victim.paused = victim.preempted = True
            victim.preemptible = False
            assert victim.task is not None  # set when it started
            victim.task.cancel()
        return jobs

    def _resume_paused(self) -> None:
        """Paused answers take their tier's room before any new job of it: they were claimed
        first. The longest paused resumes first."""
        paused = sorted((r for r in self.running.values() if r.paused), key=lambda r: r.started_at)
        for entry in paused:
            if self._room()[entry.job.tier] > 0:
                entry.paused = False
                entry.resumed.set()

    async def _claim(self, free: int) -> list[Job]:
        room = self._room()
        jobs = await self.queue.claim(total=free, per_tier=room, aging_s=self.config.normal_aging_s)
        if not jobs and room[Tier.NORMAL] == 0:
            # The free slots are VIP's reserve: a source under its share may still take one.
            jobs = await self._claim_over_share()
        if not jobs and self._affinity_applies():
            # A blocking read would take a new turn straight off the stream, whichever worker
            # has its conversation: with another worker serving, look again soon instead.
            await self._wait(self._stopped, BUSY_CLAIM_BLOCK_S)
        elif not jobs:
            tiers = [tier for tier, count in room.items() if count > 0]
            # A blocking read cannot see a slot free: with answers under way it blocks briefly.
            block_s = BUSY_CLAIM_BLOCK_S if self._active() else 1.0
            jobs = await self.queue.claim_blocking(tiers, timeout_s=block_s)
        return jobs

    def _affinity_applies(self) -> bool:
        """Whether a conversation's turn may be left to another worker (scheduler.queues)."""
        return self.queue.fair_share and settings.AFFINITY_WAIT_S > 0 and self.serving_workers > 1

    async def _unless_stopped(self, claim: Coroutine[Any, Any, list[Job]]) -> list[Job]:
        """Claim, unless told to stop first: an unresponsive Redis can hold a call for many
        seconds. A claim cut short may leave jobs claimed; they are taken over after the lease.
        One that ended with its jobs all the same hands them back."""
        claiming = asyncio.ensure_future(claim)
        stopping = asyncio.ensure_future(self._stopped.wait())
        await asyncio.wait({claiming, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not claiming.done():
            claiming.cancel()
            await _wait_for_cancelled([claiming], give_up_at=self._give_up_at)
            if claiming.done() and not claiming.cancelled() and claiming.exception() is None:
                for job in claiming.result():
                    with contextlib.suppress(RedisGaveUp):
                        await self._retrying(lambda job=job: self.queue.release(job))
            return []
        return claiming.result()

    async def _start_jobs(self, jobs: list[Job]) -> None:
        if not jobs:
            return
        try:
            # Retried like the worker's other reads: thousands of jobs claimed at once can wait
            # out the connection pool, and a job that failed here would wait for its lease.
            cancelled, previous = await self._retrying(lambda: self._job_states(jobs))
        except RedisGaveUp:
            return  # stopping: they are taken over after their lease
        now = asyncio.get_running_loop().time()
        for job in jobs:
            worker_metrics.variant_series_init(job.generation.variant)
            entry = _Running(
                job=job,
                started_at=now,
                cancel_requested=job.request_id in cancelled,
                previous_event=previous[job.request_id],
            )
            self.running[job.request_id] = entry
            entry.task = asyncio.create_task(self._serve(entry), name=f"job-{job.request_id}")

    # --- serving one job ------------------------------------------------------------------------

    def _emit(self, job: Job, body: EventBody) -> asyncio.Future[None]:
        return self.publisher.emit(job.model, job.request_id, body)

    async def _serve(self, entry: _Running) -> None:
        job = entry.job
        try:
            await self._serve_job(entry)
        except EngineDeadError as exc:
            logger.error("worker %s: engine died: %s", self.worker_id, exc)
            self.fatal = exc
            self.drain()
            return  # stays in `running`: _finish_running hands it back to the queue
        except asyncio.CancelledError:
            if self.draining:
                return  # likewise handed back
            raise
        except RedisGaveUp:
            return  # stopping without Redis: taken over after its lease
        except Exception:
            logger.exception("worker %s: job %s failed", self.worker_id, job.request_id)
            worker_metrics.GENERATIONS.labels(job.generation.variant, job.tier, "error").inc()
            self._release_slot(job)
            return  # left unacknowledged: taken over after its lease, up to max_attempts
        await self._retrying(lambda: self.queue.ack(job))
        self._release_slot(job)

    def _release_slot(self, job: Job) -> None:
        self.running.pop(job.request_id, None)
        self.publisher.forget(job.model, job.request_id)
        self._slot_freed.set()

    async def _job_states(self, jobs: list[Job]) -> tuple[set[str], dict[str, str | None]]:
        """In one round trip: which of the jobs were cancelled, and each one's latest event."""
        async with self.queue.client.pipeline(transaction=False) as pipe:
            pipe.mget([keys.cancel(job.request_id) for job in jobs])
            for job in jobs:
                pipe.xrevrange(keys.result(job.model, job.request_id), count=1)
            flags, *latest = await pipe.execute()
        cancelled = {job.request_id for job, flag in zip(jobs, flags, strict=True) if flag}
        previous = {
            job.request_id: entries[0][1]["type"] if entries else None
            for job, entries in zip(jobs, latest, strict=True)
        }
        return cancelled, previous

    async def _serve_job(self, entry: _Running) -> None:
        job = entry.job
        previous = entry.previous_event
        if previous in TERMINAL_EVENTS:
            return  # finished before the previous worker could acknowledge it
        if previous != Queued.type:
            # A worker that died or drained had started it: the client starts the answer over.
            self._emit(job, Reset(reason="worker_restarted", attempt=job.attempt))
        if entry.cancel_requested:
            await self._finish(
                job, GenerationOutcome(status=Generation.Status.CANCELLED, finish_reason="cancelled")
            )
            return
        if job.attempt == 1 and time.time() > job.deadline:
            await self._finish(
                job,
                GenerationOutcome(
                    status=Generation.Status.ERROR,
                    error_code="expired",
                    error_message="Sorry, we were too busy to answer in time. Please ask again.",
                ),
            )
            return
        self._emit(job, Start(worker=self.worker_id, variant=job.generation.variant, attempt=job.attempt))
        started = time.monotonic()
        ttft_ms: float | None = None
        finish_reason = "stop"
        last: Delta | None = None
        counted = 0  # output tokens that token events have told of (a delta's count is cumulative)
        paused_s = 0.0  # not service: another answer had the slot
        # A verified answer: its text is shown sentence by sentence, once checked.
        grounding = job.generation.grounding
        checker = AnswerChecker(grounding) if grounding is not None else None
        try:
            async with asyncio.timeout(self.config.generation_timeout_s):
                while True:
                    request = GenerationRequest(
                        request_id=job.request_id,
                        messages=job.generation.messages,
                        sampling=job.generation.sampling,
                        prompt=job.generation.prompt,
                        continuation=_continuation(entry, last),
                        tool_parsing=job.generation.tool_parsing,
                    )
                    entry.preemptible = job.tier != Tier.VIP
                    try:
                        async for last in self.engine.generate(request):
                            # A last step may write no text and still release what the
                            # tool-call parser held back (content, or a call's last piece).
                            held_back = last.parsed and (last.parsed.tool_calls or last.parsed.content)
                            text = last.text if checker is None else checker.feed(last.text)
                            if text or last.logprobs or held_back:
                                if ttft_ms is None:
                                    ttft_ms = (time.monotonic() - started) * 1000
                                self._emit(
                                    job,
                                    Token(
                                        seq=len(entry.text),
                                        text=text,
                                        tokens=last.output_tokens - counted,
                                        logprobs=last.logprobs,
                                        parsed=last.parsed,
                                    ),
                                )
                                entry.text.append(text)
                                counted = last.output_tokens
                            if last.finish_reason is not None:
                                finish_reason = last.finish_reason
                    except asyncio.CancelledError:
                        entry.preemptible = False
                        if not entry.preempted or entry.cancel_requested or self.draining:
                            raise
                        entry.preempted = False
                        # Preempted for a VIP job: the engine request is gone (and its KV
                        # cache); the customer sees a pause, then the answer goes on.
                        asyncio.current_task().uncancel()  # type: ignore[union-attr]
                        paused_at = time.monotonic()
                        await entry.resumed.wait()
                        entry.resumed.clear()
                        paused_s += time.monotonic() - paused_at
                        continue
                    entry.preemptible = False
                    break
        except TimeoutError:
            timeout_s = self.config.generation_timeout_s
            await self._finish(
                job,
                GenerationOutcome(
                    status=Generation.Status.ERROR,
                    text="".join(entry.text),
                    error_code="timeout",
                    error_message=f"The answer took longer than {timeout_s:.0f} s and was stopped.",
                ),
            )
            return
        except EngineRequestError as exc:
            # This request failed, not the engine: the answer ends with an error and the job is
            # acknowledged, since running it again would most likely fail the same way.
            logger.warning("worker %s: %s failed in the engine: %s", self.worker_id, job.request_id, exc)
            await self._finish(
                job,
                GenerationOutcome(
                    status=Generation.Status.ERROR,
                    text="".join(entry.text),
                    error_code="engine_error",
                    error_message="Sorry, the model failed while writing this answer. Please try again.",
                    usage=_usage(last),
                    timings=self._timings(job, started, ttft_ms),
                ),
            )
            return
        except asyncio.CancelledError:
            if not entry.cancel_requested or self.draining:
                raise
            finish_reason = "abort"
        if finish_reason == "abort":
            status, finish_reason = Generation.Status.CANCELLED, "cancelled"
        else:
            status = Generation.Status.DONE
            service_s = time.monotonic() - started - paused_s
            self.mean_service_s += 0.2 * (service_s - self.mean_service_s)
            if checker is not None and (rest := checker.finish(cut_off=finish_reason == "length")):
                if ttft_ms is None:
                    ttft_ms = (time.monotonic() - started) * 1000
                tokens = last.output_tokens - counted if last is not None else 0
                self._emit(job, Token(seq=len(entry.text), text=rest, tokens=tokens))
                entry.text.append(rest)
        await self._finish(
            job,
            GenerationOutcome(
                status=status,
                text="".join(entry.text),
                finish_reason=finish_reason,
                usage=_usage(last),
                timings=self._timings(job, started, ttft_ms),
                grounding=checker.report()
                if checker is not None and status == Generation.Status.DONE
                else None,
            ),
            parsed=last.parsed_answer if last is not None else None,
        )

    def _timings(self, job: Job, started: float, ttft_ms: float | None) -> Timings:
        elapsed_ms = (time.monotonic() - started) * 1000
        return Timings(
            queue_ms=round((time.time() - job.enqueued_at) * 1000 - elapsed_ms, 1),
            ttft_ms=round(ttft_ms, 1) if ttft_ms is not None else None,
            duration_ms=round(elapsed_ms, 1),
            engine=self.engine.label,
        )

    async def _finish(self, job: Job, outcome: GenerationOutcome, parsed: ParsedAnswer | None = None) -> None:
        """Store the outcome, then publish the terminal event (so a reload after `done` shows
        it), with `parsed`, the answer as its tool-call parser read it. The answer is counted
        (console series, Prometheus) only when this stored it: a job finished twice (reclaimed
        after its worker stored it) counts once."""
        entry = self.running.get(job.request_id)
        if entry is not None:
            entry.finishing = True
        stored = await self.recorder.store(job.request_id, outcome)
        if stored:
            variant = job.generation.variant
            await timeseries.answer_record(self.queue.client, variant=variant, outcome=outcome)
            worker_metrics.answer_observe(variant=variant, tier=job.tier, outcome=outcome)
        await self._retrying(
            lambda: request_finished(
                self.queue.client,
                client_id=job.generation.client_id,
                limits_client_id=job.generation.limits_client_id,
                request_id=job.request_id,
                tokens_used=outcome.usage.prompt_tokens + outcome.usage.completion_tokens,
            )
        )
        if stored and self.queue.fair_share:
            # Its source was charged its most when it was claimed: settled once, with what it used.
            await self._retrying(
                lambda: fair_share_settle(
                    self.queue.client,
                    model=self.queue.model,
                    tier=job.tier,
                    share=job.share,
                    prompt_tokens=outcome.usage.prompt_tokens,
                    completion_tokens=outcome.usage.completion_tokens,
                )
            )
        if outcome.error_code:
            event = self._emit(job, Error(code=outcome.error_code, message=outcome.error_message))
        else:
            event = self._emit(
                job,
                Done(
                    finish_reason=outcome.finish_reason,
                    usage=outcome.usage,
                    timings=outcome.timings,
                    parsed=parsed,
                    grounding=outcome.grounding,
                ),
            )
        await event

    # --- background duties ----------------------------------------------------------------------

    def cancel(self, request_id: str) -> None:
        held = self._held_vip
        if held is not None and held.job.request_id == request_id:
            held.cancelled = True  # the claim loop starts it at once; it ends unanswered
            self._slot_freed.set()
            return
        entry = self.running.get(request_id)
        if entry is None or entry.cancel_requested or entry.finishing:
            return
        entry.cancel_requested = True
        if entry.task is not None:
            entry.task.cancel()

    async def _control_loop(self) -> None:
        async for message in control.control_messages(self.queue.client):
            if message["type"] == "cancel":
                self.cancel(message["request_id"])
            elif message["type"] == "drain" and message.get("worker_id") == self.worker_id:
                self.drain()

    async def _serving_update(self) -> None:
        """Serve or wait as a warm spare until the next heartbeat; a spare that is needed is
        woken to claim at once."""
        client = self.queue.client
        try:
            if self.draining:
                await warmpool.serving_leave(client, model=self.config.model, worker_id=self.worker_id)
                return
            needed = await database_sync_to_async(warmpool.serving_needed)(model=self.config.model)
            serves = await warmpool.serving_decide(
                client, model=self.config.model, worker_id=self.worker_id, needed=needed
            )
            self.serving_workers = await warmpool.serving_count(client, model=self.config.model)
        except (*REDIS_ERRORS, DatabaseError) as exc:
            # The last decision stands until a check succeeds.
            logger.warning("worker %s: warm pool check failed (%s)", self.worker_id, exc)
            return
        if serves == self.spare:
            logger.info("worker %s: %s", self.worker_id, "serving" if serves else "warm spare")
            self.spare = not serves
            self._slot_freed.set()

    async def _serving_loop(self) -> None:
        """Apart from the heartbeat: the check waits for the database thread, which a slow
        database may hold, and a heartbeat must never wait for it."""
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            await self._serving_update()

    async def _heartbeat_loop(self) -> None:
        while True:
            stats = self.engine.stats()
            info = {
                "model": self.config.model,
                "engine": self.engine.label,
                "slots": self.slots,
                "vip_reserved_slots": self.config.vip_reserved_slots,
                "running": len(self._active()),
                "running_vip": sum(1 for r in self.running.values() if r.job.tier == Tier.VIP),
                "paused": sum(1 for r in self.running.values() if r.paused),
                # Claimed, waiting out its grace for a slot: neither queued nor running.
                "vip_waiting": self._held_vip is not None,
                "draining": self.draining,
                "spare": self.spare,
                "engine_running": stats.running,
                "engine_waiting": stats.waiting,
                "kv_cache_usage": round(stats.kv_cache_usage, 4),
                "memory_used_bytes": stats.memory_used_bytes,
                "memory_total_bytes": stats.memory_total_bytes,
                "memory_source": stats.memory_source,
                "prefix_cache_queries": stats.prefix_cache_queries,
                "prefix_cache_hits": stats.prefix_cache_hits,
                "mean_service_s": round(self.mean_service_s, 3),
            }
            normal_slots = self.slots - self.config.vip_reserved_slots
            idle = self.draining or self.spare  # adds nothing to the queues' drain rate
            try:
                await workers.heartbeat_write(
                    self.queue.client,
                    worker_id=self.worker_id,
                    info=info,
                    jobs_per_s=0.0 if idle else self.slots / self.mean_service_s,
                    normal_jobs_per_s=0.0 if idle else normal_slots / self.mean_service_s,
                )
            except REDIS_ERRORS as exc:
                logger.warning("worker %s: heartbeat failed (%s)", self.worker_id, exc)
            await timeseries.queue_depth_record(self.queue.client, model=self.config.model)
            await asyncio.sleep(self.config.heartbeat_s)

    async def _lease_loop(self) -> None:
        """Renew leases on running jobs and take over jobs whose worker died."""
        interval = lease_renewal_s(self.config.lease_s)
        while True:
            await asyncio.sleep(interval)
            try:
                jobs = [r.job for r in self.running.values()]
                if self._held_vip is not None:
                    jobs.append(self._held_vip.job)
                if jobs:
                    await self.queue.renew_leases(jobs)
                if self.draining or self.spare:
                    continue
                runnable, exhausted = await self.queue.reclaim_expired(
                    lease_s=self.config.lease_s,
                    max_count=self.slots - len(self._active()),
                    max_attempts=self.config.max_attempts,
                )
                await self.queue.dead_workers_forget(stale_s=settings.WORKER_HEARTBEAT_TTL_S)
            except REDIS_ERRORS as exc:
                logger.warning("worker %s: lease upkeep failed (%s)", self.worker_id, exc)
                continue
            for job in exhausted:
                await self._dead_letter(job)
            if runnable:
                logger.info("worker %s: took over %d jobs of a dead worker", self.worker_id, len(runnable))
                worker_metrics.JOBS_RECLAIMED.labels(self.config.model).inc(len(runnable))
                await self._start_jobs(runnable)

    async def _watch_loop(self) -> None:
        """Once a second: cancel answers nobody has watched for their grace period, and pick
        up cancels sent while this worker was not listening (a Redis restart)."""
        while True:
            await asyncio.sleep(1.0)
            jobs = [r.job for r in self.running.values() if not r.cancel_requested]
            if not jobs:
                continue
            try:
                cancelled = await control.cancelled_request_ids(
                    self.queue.client, [j.request_id for j in jobs]
                )
                abandoned = await abandoned_request_ids(self.queue.client, jobs)
            except REDIS_ERRORS as exc:
                logger.warning("worker %s: watch upkeep failed (%s)", self.worker_id, exc)
                continue
            for request_id in cancelled | abandoned:
                if request_id in abandoned:
                    logger.info(
                        "worker %s: %s has had no client for its grace period", self.worker_id, request_id
                    )
                self.cancel(request_id)

    async def _dead_letter(self, job: Job) -> None:
        logger.error(
            "worker %s: job %s failed %d times; dead-lettered",
            self.worker_id,
            job.request_id,
            job.attempt - 1,
        )
        await self._finish(
            job,
            GenerationOutcome(
                status=Generation.Status.ERROR,
                error_code="failed",
                error_message="Sorry, this answer could not be generated. Please try again.",
            ),
        )
        await self.queue.dead_letter(job, reason="max_attempts")
        worker_metrics.JOBS_DEAD_LETTERED.labels(job.model).inc()

    # --- helpers ----------------------------------------------------------------------------------

    async def _wait(self, event: asyncio.Event, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)

    async def _retrying(self, operation):
        """Run a Redis operation until it succeeds; Redis restarts are waited out, except by a
        stopping worker, which gives up (RedisGaveUp) at the end of its drain and hand-back."""
        delay = 0.05
        loop = asyncio.get_running_loop()
        while True:
            try:
                if self._give_up_at is None:
                    return await operation()
                async with asyncio.timeout_at(self._give_up_at):
                    return await operation()
            except REDIS_ERRORS as exc:
                logger.warning("worker %s: redis unavailable (%s); retrying", self.worker_id, exc)
            except TimeoutError:
                if self._give_up_at is None:
                    raise
                raise RedisGaveUp from None
            if self._give_up_at is not None and loop.time() + delay >= self._give_up_at:
                raise RedisGaveUp
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


class _Recorder:
    """Stores how generations ended. Those that end while the previous store is being written
    are stored together, in one transaction (one commit for all), which is what most of a
    store cost on SQLite: answers that end together, as a burst of them does, are stored in
    a few writes instead of one each. A batch that fails is stored again one by one, so a
    generation that cannot be stored fails alone (its job is then taken over after its lease)."""

    def __init__(self) -> None:
        self._waiting: list[tuple[str, GenerationOutcome, asyncio.Future[bool]]] = []
        self._writing: asyncio.Task[None] | None = None

    async def store(self, request_id: str, outcome: GenerationOutcome) -> bool:
        """Whether this stored it (False: it had been stored already, see generation_finish)."""
        stored = asyncio.get_running_loop().create_future()
        self._waiting.append((request_id, outcome, stored))
        if self._writing is None or self._writing.done():
            self._writing = asyncio.create_task(self._write(), name="generation-recorder")
        return await stored

    async def _write(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            finished = [(request_id, outcome) for request_id, outcome, _ in batch]
            try:
                results: list[bool | BaseException] = list(
                    await database_sync_to_async(generations_finish)(finished)
                )
            except Exception:
                results = [await self._write_one(request_id, outcome) for request_id, outcome in finished]
            for (_, _, stored), result in zip(batch, results, strict=True):
                if stored.done():
                    continue  # its job was cancelled meanwhile
                if isinstance(result, BaseException):
                    stored.set_exception(result)
                else:
                    stored.set_result(result)

    @staticmethod
    async def _write_one(request_id: str, outcome: GenerationOutcome) -> bool | BaseException:
        try:
            [stored] = await database_sync_to_async(generations_finish)([(request_id, outcome)])
        except Exception as exc:
            return exc
        return stored


async def _wait_for_cancelled(tasks: list[asyncio.Task], *, give_up_at: float | None) -> None:
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


def _continuation(entry: _Running, last: Delta | None) -> Continuation | None:
    """What a resumed answer goes on from: its streamed text (None before its first token)."""
    if last is None or last.output_tokens == 0:
        return None
    return Continuation(text="".join(entry.text), output_tokens=last.output_tokens)


def _usage(last: Delta | None) -> Usage:
    """Token counts as OpenAI reports them, from the last delta (its counts are cumulative)."""
    if last is None:
        return Usage()
    return Usage(prompt_tokens=last.prompt_tokens, completion_tokens=last.output_tokens)
