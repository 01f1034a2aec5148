"""The inference worker: claim jobs while there are free sequence slots, run them through the
engine, publish their tokens, store the answers, and keep the registry told that it is alive.

One worker process serves one model, and with it every variant on that model: a job carries
its variant's prompt and sampling, so the worker needs nothing else to answer it. Jobs are
acknowledged only after the answer is stored, so a worker that dies leaves its jobs pending, and
another worker takes them over once their lease runs out.

This module is the lifecycle and the loops; each concern has its own room:
- inference.slots: the answers held and the sequence slots; which tier may start, which answer
  a VIP job or a source under its fair share pauses (decisions, no I/O);
- inference.claiming: taking the next jobs from the queues, holding a VIP job for its grace;
- inference.answering: one job through the engine, its tokens published, paused and resumed;
- inference.outcomes: storing, counting and publishing how an answer ended;
- inference.stopping: waiting on Redis and on tasks without being stuck when told to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError

from inference import metrics as worker_metrics
from inference.answering import AnswerWriter
from inference.claiming import Claimer
from inference.engines import build_engine
from inference.engines.base import Engine, EngineDeadError
from inference.outcomes import Outcomes
from inference.slots import Answer, Slots
from inference.stopping import REDIS_ERRORS, RedisGaveUp, RedisRetry, wait_for, wait_for_cancelled
from scheduler import control, keys, timeseries, warmpool, workers
from scheduler.generation import ParsedAnswer, Tier
from scheduler.models import Generation
from scheduler.queues import Job, JobQueue
from scheduler.redis import async_redis
from scheduler.results import ResultPublisher, abandoned_request_ids
from scheduler.rules import lease_renewal_s
from scheduler.services import GenerationOutcome

logger = logging.getLogger(__name__)

# After the drain timeout, how long a stopping worker keeps trying to hand jobs back and leave
# the registry before it exits anyway: what it could not hand back is taken over after its
# lease, as after a crash.
HAND_BACK_S = 5.0


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


class InferenceWorker:
    def __init__(self, engine: Engine, config: WorkerConfig) -> None:
        self.engine = engine
        self.config = config
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.slots = Slots(
            engine.max_num_seqs,
            vip_reserved=config.vip_reserved_slots,
            batch_max=config.batch_max_slots,
            vip_preemption=config.vip_preemption,
            fair_share_preemption=config.fair_share_preemption,
        )
        self.draining = False
        self.spare = False  # a warm spare: engine loaded, claiming nothing (scheduler/warmpool.py)
        self.serving_workers = 1  # the model's, as of the last heartbeat (this one among them)
        self.fatal: BaseException | None = None
        self.mean_service_s = config.service_time_prior_s  # smoothed over finished answers
        self.retry = RedisRetry(self.worker_id)
        self.writer = AnswerWriter(
            engine,
            worker_id=self.worker_id,
            timeout_s=config.generation_timeout_s,
            draining=lambda: self.draining,
        )
        self._slot_freed = asyncio.Event()
        self._stopped = asyncio.Event()

    @classmethod
    def from_settings(cls) -> InferenceWorker:
        return cls(build_engine(), WorkerConfig.from_settings())

    @property
    def running(self) -> dict[str, Answer]:
        """The answers this worker holds, by request id (paused ones among them)."""
        return self.slots.answers

    # --- lifecycle -------------------------------------------------------------------------

    def connect(self, client: aioredis.Redis) -> None:
        """Its queues, its result streams and what uses them, on this Redis client."""
        self.queue = JobQueue(client, model=self.config.model, consumer=self.worker_id)
        self.publisher = ResultPublisher(client)
        self.outcomes = Outcomes(
            client, self.publisher, self.retry, model=self.config.model, fair_share=self.queue.fair_share
        )
        self.claimer = Claimer(
            self.queue,
            self.slots,
            self.retry,
            worker_id=self.worker_id,
            normal_aging_s=self.config.normal_aging_s,
            vip_preempt_after_s=self.config.vip_preempt_after_s,
            slot_freed=self._slot_freed,
            stopped=self._stopped,
            others_serving=lambda: self.serving_workers > 1,
        )

    async def run(self) -> None:
        """Serve until drained or the engine dies (then raise EngineDeadError)."""
        client = async_redis()
        self.connect(client)
        started = time.monotonic()
        await self.engine.start()
        logger.info(
            "worker %s: engine %s ready in %.1fs, %d slots (%d reserved for VIP), model %s",
            self.worker_id,
            self.engine.label,
            time.monotonic() - started,
            self.slots.capacity,
            self.config.vip_reserved_slots,
            self.config.model,
        )
        background: list[asyncio.Task] = []
        try:
            await self.retry(self.queue.ensure_groups)
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
            await wait_for_cancelled(background, give_up_at=self.retry.give_up_at)
            await self.queue.recordings_wait()
            with contextlib.suppress(RedisGaveUp):
                await self.retry(
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
            self.retry.give_up_at = loop.time() + self.config.drain_timeout_s + HAND_BACK_S
        self.draining = True
        for answer in self.running.values():
            answer.paused = False  # paused answers finish within the drain too
            answer.resumed.set()
        self._stopped.set()
        self._slot_freed.set()

    async def _finish_running(self) -> None:
        await self.claimer.held_vip_release()
        tasks = [a.task for a in self.running.values() if a.task is not None]
        if tasks and self.fatal is None:
            await asyncio.wait(tasks, timeout=self.config.drain_timeout_s)
        # Those past the engine are storing their answer: handed back, they would run again
        # while the first answer stays the stored one.
        finishing = [a.task for a in self.running.values() if a.finishing and a.task is not None]
        if finishing and self.retry.give_up_at is not None:
            remaining_s = self.retry.give_up_at - asyncio.get_running_loop().time()
            await asyncio.wait(finishing, timeout=max(remaining_s, 0.0))
        kept = 0
        for answer in list(self.running.values()):
            try:
                await self.retry(lambda job=answer.job: self.queue.release(job))
            except RedisGaveUp:
                kept += 1
            if answer.task is not None:
                answer.task.cancel()
        if kept:
            logger.warning(
                "worker %s: could not hand %d jobs back; they are taken over when their lease runs out",
                self.worker_id,
                kept,
            )
        await wait_for_cancelled(
            [a.task for a in self.running.values() if a.task is not None], give_up_at=self.retry.give_up_at
        )

    # --- the claim loop ----------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        while not self.draining:
            if (held := self.claimer.held_vip_ready()) is not None:
                cancelled = {held.job.request_id} if held.cancelled else set()  # it only ends
                await self._start_jobs([held.job], cancelled)
                continue
            if self.spare:
                await self.claimer.held_vip_release()
                self._slot_freed.clear()
                await wait_for(self._slot_freed, 1.0)
                continue
            try:
                jobs = await self.claimer.next_jobs()
            except REDIS_ERRORS as exc:
                logger.warning("worker %s: claiming failed (%s); retrying", self.worker_id, exc)
                await wait_for(self._stopped, 0.5)
                continue
            await self._start_jobs(jobs)

    async def _start_jobs(self, jobs: list[Job], cancelled: Iterable[str] = ()) -> None:
        if not jobs:
            return
        try:
            # Retried like the worker's other reads: thousands of jobs claimed at once can wait
            # out the connection pool, and a job that failed here would wait for its lease.
            flagged, previous = await self.retry(lambda: _job_states(self.queue.client, jobs))
        except RedisGaveUp:
            return  # stopping: they are taken over after their lease
        cancelled = {*cancelled, *flagged}
        now = asyncio.get_running_loop().time()
        for job in jobs:
            worker_metrics.variant_series_init(job.generation.variant)
            answer = Answer(
                job=job,
                started_at=now,
                cancel_requested=job.request_id in cancelled,
                previous_event=previous[job.request_id],
            )
            self.running[job.request_id] = answer
            answer.task = asyncio.create_task(self._serve(answer), name=f"job-{job.request_id}")

    # --- serving one job ------------------------------------------------------------------------

    async def _serve(self, answer: Answer) -> None:
        job = answer.job
        try:
            written = await self.writer.write(answer, lambda body: self.outcomes.emit(job, body))
            if written is not None:
                if written.service_s is not None:
                    self.mean_service_s += 0.2 * (written.service_s - self.mean_service_s)
                await self._finish(job, written.outcome, written.parsed)
        except EngineDeadError as exc:
            self._engine_died(exc)
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
        await self.retry(lambda: self.queue.ack(job))
        self._release_slot(job)

    async def _finish(self, job: Job, outcome: GenerationOutcome, parsed: ParsedAnswer | None) -> None:
        answer = self.running.get(job.request_id)
        if answer is not None:
            answer.finishing = True  # a cancel now comes too late to change it
        await self.outcomes.finish(job, outcome, parsed)

    def _release_slot(self, job: Job) -> None:
        self.running.pop(job.request_id, None)
        self.publisher.forget(job.model, job.request_id)
        self._slot_freed.set()

    def cancel(self, request_id: str) -> None:
        held = self.claimer.held_vip
        if held is not None and held.job.request_id == request_id:
            held.cancelled = True  # the claim loop starts it at once; it ends unanswered
            self._slot_freed.set()
            return
        answer = self.running.get(request_id)
        if answer is None or answer.cancel_requested or answer.finishing:
            return
        answer.cancel_requested = True
        if answer.task is not None:
            answer.task.cancel()

    # --- background duties ----------------------------------------------------------------------

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

    def _engine_died(self, exc: EngineDeadError) -> None:
        """Stop serving: the running answers go back to the queue, and the worker exits with
        the error (its launcher starts another)."""
        if self.fatal is None:
            logger.error("worker %s: engine died: %s", self.worker_id, exc)
            self.fatal = exc
        self.drain()

    async def _heartbeat_loop(self) -> None:
        while True:
            try:
                stats = self.engine.stats()
            except EngineDeadError as exc:  # died with nothing running, or between answers
                self._engine_died(exc)
                return
            answers = self.running.values()
            capacity = self.slots.capacity
            info = {
                "model": self.config.model,
                "engine": self.engine.label,
                "slots": capacity,
                "vip_reserved_slots": self.config.vip_reserved_slots,
                "running": len(self.slots.active()),
                "running_vip": sum(1 for a in answers if a.job.tier == Tier.VIP),
                "paused": sum(1 for a in answers if a.paused),
                # Claimed, waiting out its grace for a slot: neither queued nor running.
                "vip_waiting": self.claimer.held_vip is not None,
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
            normal_slots = capacity - self.config.vip_reserved_slots
            idle = self.draining or self.spare  # adds nothing to the queues' drain rate
            try:
                await workers.heartbeat_write(
                    self.queue.client,
                    worker_id=self.worker_id,
                    info=info,
                    jobs_per_s=0.0 if idle else capacity / self.mean_service_s,
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
                jobs = [a.job for a in self.running.values()]
                if self.claimer.held_vip is not None:
                    jobs.append(self.claimer.held_vip.job)
                if jobs:
                    await self.queue.renew_leases(jobs)
                if self.draining or self.spare:
                    continue
                runnable, exhausted = await self.queue.reclaim_expired(
                    lease_s=self.config.lease_s,
                    max_count=self.slots.free(),
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
            jobs = [a.job for a in self.running.values() if not a.cancel_requested]
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
        await self.outcomes.finish(
            job,
            GenerationOutcome(
                status=Generation.Status.ERROR,
                error_code="failed",
                error_message="Sorry, this answer could not be generated. Please try again.",
            ),
        )
        await self.queue.dead_letter(job, reason="max_attempts")
        worker_metrics.JOBS_DEAD_LETTERED.labels(job.model).inc()


async def _job_states(client: aioredis.Redis, jobs: list[Job]) -> tuple[set[str], dict[str, str | None]]:
    """In one round trip: which of the jobs were cancelled, and each one's latest event."""
    async with client.pipeline(transaction=False) as pipe:
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
