"""Batch jobs: chat requests submitted together and answered in the scheduler's `batch` tier,
fed by Celery tasks, their results stored as they arrive and polled through the API.

A task holds its job under a lease in the database. It submits a few requests at a time
(`BATCH_JOB_MAX_IN_FLIGHT`), waits out a 429/503 for its Retry-After, follows the result
streams of what it submitted with one blocking XREAD, and stores each answer as it ends. After
one slice of time it hands the job to a fresh task, so tasks stay short and a worker's warm
shutdown does not wait for a whole job. A task that dies leaves its lease to run out; the
periodic sweep then starts another, which re-follows the submitted requests from the start of
their result streams. A request's id is stored before the request is submitted, so a task
that died between the two is found out (the request has a result stream) and nothing is asked
twice.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, QuerySet, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from accounts.models import User
from api.models import ApiKey, BatchJob, BatchJobItem
from api.openai_requests import ChatCompletionRequest
from api.openai_shapes import ChoiceOutcome, completion_object
from scheduler import control, keys
from scheduler.admission import AdmissionRefused, request_submit
from scheduler.generation import (
    AnswerFold,
    Done,
    Error,
    GenerationJob,
    Origin,
    SamplingParams,
    Tier,
    Usage,
    event_decode,
)
from scheduler.key_limits import KeyLimits
from scheduler.models import Generation
from scheduler.prompt import prompt_token_count
from scheduler.redis import sync_redis
from scheduler.routing import canary_split, variant_for_conversation, variant_for_request
from scheduler.services import GenerationOutcome, generation_create, generation_finish

logger = logging.getLogger(__name__)

ACTIVE = (BatchJob.Status.QUEUED, BatchJob.Status.RUNNING)
UNFINISHED = (BatchJobItem.Status.PENDING, BatchJobItem.Status.SUBMITTED)
READ_BLOCK_S = 1.0  # bounds how late a shutdown is noticed; below the Redis client's socket timeout
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError)
# A full queue's Retry-After is its whole predicted drain time, but room for the next request
# opens as soon as a worker claims one: look again after this at the latest.
MAX_SUBMIT_BACKOFF_S = 30.0


def _lease() -> timedelta:
    return timedelta(seconds=settings.BATCH_JOB_LEASE_S)


class TooManyActiveJobs(Exception):
    """The owner already has BATCH_JOB_MAX_ACTIVE_PER_OWNER jobs queued or running."""


class RequestTooLarge(Exception):
    """A request's worst case (prompt and max_tokens) exceeds its key's tokens per minute: it
    would never be admitted, and its job would never end."""

    def __init__(self, *, index: int, tokens: int, tokens_per_minute: int) -> None:
        super().__init__(index, tokens)
        self.index = index
        self.tokens = tokens
        self.tokens_per_minute = tokens_per_minute


class ModelUnknown(Exception):
    """A request names a model no variant answers."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model


# --- writes -----------------------------------------------------------------------------------


def _tokens_at_most(stored: dict[str, Any]) -> int:
    """The most a stored request may use, its prompt and its max_tokens: what its key's tokens
    bucket reserves when it is submitted."""
    return prompt_token_count(stored["messages"], model_path=settings.INFERENCE_MODEL) + int(
        stored["max_tokens"]
    )


def job_create(*, api_key: ApiKey, requests: list[ChatCompletionRequest]) -> BatchJob:
    """Store the job and its requests, ready for a Celery task to feed (api.tasks.job_start).
    Raises ModelUnknown, RequestTooLarge or TooManyActiveJobs."""
    for request in requests:
        if variant_for_request(model=request.model, request_id=str(uuid.uuid4())) is None:
            raise ModelUnknown(request.model)
    stored = [
        {"model": request.model, "messages": request.prompt_messages(), **request.sampling_params().to_dict()}
        for request in requests
    ]
    tokens_per_minute = api_key.tokens_per_minute
    if tokens_per_minute is not None:
        for index, request in enumerate(stored):
            if (tokens := _tokens_at_most(request)) > tokens_per_minute:
                raise RequestTooLarge(index=index, tokens=tokens, tokens_per_minute=tokens_per_minute)
    with transaction.atomic():
        # Locking the owner's row serialises one owner's creations, so two at once cannot both
        # pass the count below.
        User.objects.select_for_update().filter(pk=api_key.owner_id).exists()
        limit = settings.BATCH_JOB_MAX_ACTIVE_PER_OWNER
        if BatchJob.objects.filter(owner_id=api_key.owner_id, status__in=ACTIVE).count() >= limit:
            raise TooManyActiveJobs(
                f"You already have {limit} unfinished jobs; wait for one to finish or cancel one."
            )
        # The lease keeps the sweep from starting a second task while the first is on its way.
        job = BatchJob.objects.create(
            owner=api_key.owner, api_key=api_key, lease_expires_at=timezone.now() + _lease()
        )
        BatchJobItem.objects.bulk_create(
            BatchJobItem(job=job, index=n, request=request) for n, request in enumerate(stored)
        )
    return job


def job_cancel(*, job: BatchJob, status: str = BatchJob.Status.CANCELLED) -> bool:
    """Stop the job now, ending it with `status`: unanswered requests are cancelled (those in
    the scheduler too), answers already stored stay. False when the job had already ended."""
    now = timezone.now()
    with transaction.atomic():
        ended = BatchJob.objects.filter(pk=job.pk, status__in=ACTIVE).update(
            status=status, finished_at=now, runner="", lease_expires_at=None
        )
        if not ended:
            return False
        unfinished = job.items.filter(status__in=UNFINISHED)
        request_ids = [
            str(rid) for rid in unfinished.exclude(generation_id=None).values_list("generation_id", flat=True)
        ]
        unfinished.update(status=BatchJobItem.Status.CANCELLED, completed_at=now)
    # A request still queued is skipped when a worker claims it; a running one is aborted.
    for request_id in request_ids:
        control.request_cancel(request_id=request_id)
    job.refresh_from_db()
    return True


def jobs_stop_for_revoked_key(*, api_key: ApiKey) -> int:
    """End the unfinished jobs submitted with a key just revoked; returns how many."""
    return sum(
        job_cancel(job=job, status=BatchJob.Status.KEY_REVOKED)
        for job in BatchJob.objects.filter(api_key=api_key, status__in=ACTIVE)
    )


def _lease_take(job_id: UUID, runner: str) -> bool:
    now = timezone.now()
    return (
        BatchJob.objects.filter(
            Q(runner="") | Q(lease_expires_at__lt=now), pk=job_id, status__in=ACTIVE
        ).update(
            runner=runner,
            lease_expires_at=now + _lease(),
            status=BatchJob.Status.RUNNING,
            started_at=Coalesce("started_at", Value(now)),
        )
        == 1
    )


def _lease_renew(job_id: UUID, runner: str) -> bool:
    """False when the job was cancelled, or another task took it over."""
    return (
        BatchJob.objects.filter(pk=job_id, runner=runner, status__in=ACTIVE).update(
            lease_expires_at=timezone.now() + _lease()
        )
        == 1
    )


def _lease_hand_over(job_id: UUID, runner: str) -> None:
    """Free the job for the next task at once; the lease still holds the sweep off meanwhile."""
    BatchJob.objects.filter(pk=job_id, runner=runner).update(
        runner="", lease_expires_at=timezone.now() + _lease()
    )


def _job_complete(job_id: UUID, runner: str) -> None:
    BatchJob.objects.filter(pk=job_id, runner=runner, status=BatchJob.Status.RUNNING).update(
        status=BatchJob.Status.COMPLETED, finished_at=timezone.now(), runner="", lease_expires_at=None
    )


def _item_reserve(item: BatchJobItem) -> bool:
    request_id = uuid.uuid4()
    # Items stored before they kept their model are the stable variant's, as routed then.
    model = item.request.get("model") or canary_split().stable_variant
    variant = variant_for_request(model=model, request_id=str(request_id))
    if variant is None:  # removed since the job was created
        variant = variant_for_conversation(conversation_id=str(request_id))
    reserved = BatchJobItem.objects.filter(
        pk=item.pk, status=BatchJobItem.Status.PENDING, generation_id__isnull=True
    ).update(generation_id=request_id, variant=variant.name, model=variant.model)
    item.generation_id, item.variant, item.model = request_id, variant.name, variant.model
    return reserved == 1


def _item_mark_submitted(item: BatchJobItem) -> bool:
    return (
        BatchJobItem.objects.filter(pk=item.pk, status=BatchJobItem.Status.PENDING).update(
            status=BatchJobItem.Status.SUBMITTED, submitted_at=timezone.now()
        )
        == 1
    )


def _item_fail_too_large(
    item: BatchJobItem, *, job: GenerationJob, tokens: int, tokens_per_minute: int
) -> None:
    """End an item its key can no longer admit, with the error stored as a worker stores one."""
    message = (
        f"Request too large: it may use {tokens} tokens (prompt and max_tokens), over this key's "
        f"limit of {tokens_per_minute} tokens per minute."
    )
    with transaction.atomic():
        generation_create(job=job)
        generation_finish(
            request_id=job.request_id,
            outcome=GenerationOutcome(
                status=Generation.Status.ERROR, error_code="rate_limit_exceeded", error_message=message
            ),
        )
        BatchJobItem.objects.filter(pk=item.pk, status=BatchJobItem.Status.PENDING).update(
            status=BatchJobItem.Status.FAILED, completed_at=timezone.now()
        )


def _item_finish(item_id: int, *, end: Done | Error) -> None:
    """The item's answer ended (and is in its generation record: the worker stores it before
    it publishes the end). Only a submitted item: a cancelled job's items stay cancelled."""
    if isinstance(end, Error):
        status = BatchJobItem.Status.FAILED
    elif end.finish_reason == "cancelled":
        status = BatchJobItem.Status.CANCELLED
    else:
        status = BatchJobItem.Status.COMPLETED
    BatchJobItem.objects.filter(pk=item_id, status=BatchJobItem.Status.SUBMITTED).update(
        status=status, completed_at=timezone.now()
    )


# --- feeding ------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Followed:
    item_id: int
    stream: str
    cursor: str = "0-0"  # from the start: a resumed task replays what it did not see
    answer: AnswerFold = field(default_factory=AnswerFold)


class _JobFeeder:
    def __init__(self, job_id: UUID, runner: str) -> None:
        self.job_id = job_id
        self.runner = runner
        job = BatchJob.objects.select_related("api_key").get(pk=job_id)
        # The owner's batch limits apply to all their jobs together, however many they start;
        # the key's own requests and tokens per minute to each item, as to its other requests.
        self.client_id = job.client_id
        self.api_key = job.api_key
        self.key_limits = job.api_key.limits if job.api_key is not None else KeyLimits()
        self.redis = sync_redis()
        self.items = BatchJobItem.objects.filter(job_id=job_id)
        self.followed: dict[str, _Followed] = {}  # by result stream key
        self.submit_after = 0.0  # monotonic time until which admission asked us to wait
        self.renewed_at = time.monotonic()

    def run(self, *, deadline: float, stop_requested: Callable[[], bool]) -> bool:
        """Feed until the job ends (False) or the slice is over (True: hand it on)."""
        for item in self.items.filter(status=BatchJobItem.Status.SUBMITTED):
            self._follow(item)
        while True:
            if time.monotonic() - self.renewed_at >= settings.BATCH_JOB_LEASE_S / 3:
                if not _lease_renew(self.job_id, self.runner):
                    return False
                self.renewed_at = time.monotonic()
            try:
                self._submit_more()
                if not self.followed and not self.items.filter(status=BatchJobItem.Status.PENDING).exists():
                    _job_complete(self.job_id, self.runner)
                    return False
                if time.monotonic() >= deadline or stop_requested():
                    _lease_hand_over(self.job_id, self.runner)
                    return True
                self._read_results(block_s=max(0.001, min(READ_BLOCK_S, deadline - time.monotonic())))
            except REDIS_ERRORS as exc:
                logger.warning("job %s: Redis unavailable (%s); retrying", self.job_id, exc)
                time.sleep(1.0)

    def _follow(self, item: BatchJobItem) -> None:
        stream = keys.result(item.model, str(item.generation_id))
        self.followed[stream] = _Followed(item_id=item.pk, stream=stream)

    def _submit_more(self) -> None:
        room = settings.BATCH_JOB_MAX_IN_FLIGHT - len(self.followed)
        if room <= 0 or time.monotonic() < self.submit_after:
            return
        for item in self.items.filter(status=BatchJobItem.Status.PENDING).order_by("index")[:room]:
            try:
                submitted = self._submit(item)
            except AdmissionRefused as refusal:
                logger.info(
                    "job %s: %s; next submission in %ds", self.job_id, refusal.reason, refusal.retry_after_s
                )
                self.submit_after = time.monotonic() + min(refusal.retry_after_s, MAX_SUBMIT_BACKOFF_S)
                return
            if submitted:
                self._follow(item)

    def _submit(self, item: BatchJobItem) -> bool:
        """Submit one item; False when it is no longer pending (its job was cancelled)."""
        if item.generation_id is None:
            if not _item_reserve(item):
                return False
        elif self.redis.exists(keys.result(item.model, str(item.generation_id))):
            # Submitted by a task that died before it could record so.
            return _item_mark_submitted(item)
        job = GenerationJob(
            request_id=str(item.generation_id),
            origin=Origin.BATCH,
            messages=item.request["messages"],
            sampling=SamplingParams.from_dict(item.request),
            client_id=self.client_id,
            tier=Tier.BATCH,
            variant=item.variant,
            model=item.model,
            disconnect_grace_s=None,  # nobody watches a batch request's stream
            key_client_id=None if self.api_key is None else self.api_key.client_id,
        )
        tokens_per_minute = self.key_limits.tokens_per_minute
        tokens = _tokens_at_most(item.request) if tokens_per_minute is not None else 0
        if tokens_per_minute is not None and tokens > tokens_per_minute:
            # The key's limit was lowered below it since the job was posted: it would never be
            # admitted, and the job would wait for it for ever.
            _item_fail_too_large(item, job=job, tokens=tokens, tokens_per_minute=tokens_per_minute)
            return False
        request_submit(job=job, limits=self.key_limits, tokens=tokens)
        if not _item_mark_submitted(item):
            control.request_cancel(request_id=str(item.generation_id))
            return False
        return True

    def _read_results(self, block_s: float) -> None:
        if not self.followed:
            time.sleep(min(block_s, max(0.05, self.submit_after - time.monotonic())))
            return
        streams = {stream: followed.cursor for stream, followed in self.followed.items()}
        # BLOCK 0 would wait forever: at least a millisecond.
        for stream, entries in self.redis.xread(streams, count=512, block=max(1, int(block_s * 1000))) or []:
            followed = self.followed[stream]
            for entry_id, fields in entries:
                followed.cursor = entry_id
                followed.answer.add(event_decode(fields["type"], json.loads(fields["data"])))
                if followed.answer.end is not None:
                    _item_finish(followed.item_id, end=followed.answer.end)
                    del self.followed[stream]
                    break


def job_feed(*, job_id: UUID, budget_s: float, stop_requested: Callable[[], bool] = lambda: False) -> bool:
    """Feed the job for up to `budget_s`. True when it needs another slice; False when it
    ended, was cancelled, or another task holds it."""
    runner = uuid.uuid4().hex
    if not _lease_take(job_id, runner):
        return False
    feeder = _JobFeeder(job_id, runner)
    try:
        return feeder.run(deadline=time.monotonic() + budget_s, stop_requested=stop_requested)
    except BaseException:
        _lease_hand_over(job_id, runner)  # the sweep's next task retries it
        raise


# --- reads --------------------------------------------------------------------------------------


def job_get(*, job_id: UUID, owner: User) -> BatchJob:
    """Raises BatchJob.DoesNotExist for unknown ids and for other owners' jobs."""
    return BatchJob.objects.get(pk=job_id, owner=owner)


def job_progress(*, job: BatchJob) -> dict[str, int]:
    counts = dict(job.items.values_list("status").annotate(n=Count("pk")).order_by())
    progress = {status: counts.get(status, 0) for status in BatchJobItem.Status.values}
    return {"total": sum(progress.values()), **progress}


def job_items(*, job: BatchJob) -> QuerySet[BatchJobItem]:
    return job.items.select_related("generation").order_by("index")


def job_ids_stalled() -> list[UUID]:
    """Unfinished jobs no task holds any more (their task died, or its message was lost)."""
    now = timezone.now()
    return list(
        BatchJob.objects.filter(
            Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now), status__in=ACTIVE
        ).values_list("pk", flat=True)
    )


# --- as the API shows them ----------------------------------------------------------------------


def _timestamp(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def _item_result(item: BatchJobItem) -> dict[str, Any]:
    result: dict[str, Any] = {"index": item.index, "status": item.status, "response": None, "error": None}
    if item.status == BatchJobItem.Status.COMPLETED:
        answer = item.generation
        result["response"] = completion_object(
            request_id=str(item.generation_id),
            created=_timestamp(answer.finished_at) or 0,
            model=answer.variant,
            choices=[ChoiceOutcome(text=answer.text, finish_reason=answer.finish_reason)],
            usage=Usage(answer.prompt_tokens or 0, answer.completion_tokens or 0),
        )
    elif item.status == BatchJobItem.Status.FAILED:
        answer = item.generation
        result["error"] = {"code": answer.error_code, "message": answer.error_message}
    elif item.status == BatchJobItem.Status.CANCELLED and item.job.status == BatchJob.Status.KEY_REVOKED:
        result["error"] = {
            "code": "key_revoked",
            "message": "The job's API key was revoked before this request was answered.",
        }
    elif item.status == BatchJobItem.Status.CANCELLED:
        result["error"] = {
            "code": "cancelled",
            "message": "The job was cancelled before this request was answered.",
        }
    return result


def job_object(
    job: BatchJob, progress: dict[str, int], items: Iterable[BatchJobItem] | None = None
) -> dict[str, Any]:
    """The job as the API shows it; `results` (one per request, in order) when items are given."""
    body: dict[str, Any] = {
        "id": str(job.pk),
        "object": "job",
        "status": job.status,
        "created_at": _timestamp(job.created_at),
        "started_at": _timestamp(job.started_at),
        "finished_at": _timestamp(job.finished_at),
        "progress": progress,
    }
    if items is not None:
        body["results"] = [_item_result(item) for item in items]
    return body
