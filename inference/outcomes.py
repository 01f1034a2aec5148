"""How an answer's end is made known: stored in the database, counted, its limits and fair
share settled, and its terminal event published, in that order (so a reload after `done`
finds the answer stored)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from channels.db import database_sync_to_async

from inference import metrics as worker_metrics
from inference.stopping import RedisRetry
from scheduler import timeseries
from scheduler.admission import request_finished
from scheduler.fair_share import fair_share_settle
from scheduler.generation import Done, Error, EventBody, ParsedAnswer
from scheduler.queues import Job
from scheduler.results import ResultPublisher
from scheduler.services import GenerationOutcome, generations_finish


class Outcomes:
    def __init__(
        self,
        client: aioredis.Redis,
        publisher: ResultPublisher,
        retry: RedisRetry,
        *,
        model: str,
        fair_share: bool,
    ) -> None:
        self.client = client
        self.publisher = publisher
        self.retry = retry
        self.model = model
        self.fair_share = fair_share
        self.recorder = _Recorder()

    def emit(self, job: Job, body: EventBody) -> asyncio.Future[None]:
        return self.publisher.emit(job.model, job.request_id, body)

    async def finish(self, job: Job, outcome: GenerationOutcome, parsed: ParsedAnswer | None = None) -> None:
        """Store the outcome, then publish the terminal event, with `parsed`, the answer as its
        tool-call parser read it. The answer is counted (console series, Prometheus) only when
        this stored it: a job finished twice (reclaimed after its worker stored it) counts once."""
        stored = await self.recorder.store(job.request_id, outcome)
        if stored:
            variant = job.generation.variant
            await timeseries.answer_record(self.client, variant=variant, outcome=outcome)
            worker_metrics.answer_observe(variant=variant, tier=job.tier, outcome=outcome)
        await self.retry(
            lambda: request_finished(
                self.client,
                client_id=job.generation.client_id,
                limits_client_id=job.generation.limits_client_id,
                request_id=job.request_id,
                tokens_used=outcome.usage.prompt_tokens + outcome.usage.completion_tokens,
            )
        )
        if stored and self.fair_share:
            # Its source was charged its most when it was claimed: settled once, with what it used.
            await self.retry(
                lambda: fair_share_settle(
                    self.client,
                    model=self.model,
                    tier=job.tier,
                    share=job.share,
                    prompt_tokens=outcome.usage.prompt_tokens,
                    completion_tokens=outcome.usage.completion_tokens,
                )
            )
        if outcome.error_code:
            event = self.emit(job, Error(code=outcome.error_code, message=outcome.error_message))
        else:
            event = self.emit(
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
