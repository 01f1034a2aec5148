"""Writes of the generation record (scheduler.models.Generation): created at admission,
finished once by the worker that ran it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from scheduler.generation import GenerationJob, GroundingReport, Timings, Usage
from scheduler.models import CacheResult, Generation


@dataclass(frozen=True, slots=True)
class GenerationOutcome:
    """How one generation ended, as its worker writes it."""

    status: Generation.Status  # anything but pending
    text: str = ""
    finish_reason: str = ""
    error_code: str = ""
    error_message: str = ""
    usage: Usage = field(default_factory=Usage)
    timings: Timings | None = None
    # Answered from the result cache: how it matched (scheduler.models.CacheResult), and the
    # engine time the answer had cost when it was generated. Blank for any other answer.
    cache: str = ""
    saved_engine_ms: float | None = None
    grounding: GroundingReport | None = None  # what was checked in a chat answer


def generation_create(*, job: GenerationJob) -> Generation:
    """The request's record, pending until its worker finishes it. A resubmission of the same
    request (a batch task that died mid-submission) finds the record it made."""
    generation, _ = Generation.objects.get_or_create(
        request_id=job.request_id,
        defaults={
            "origin": job.origin,
            "variant": job.variant,
            "model": job.model,
            "tier": job.tier,
            "client_id": job.client_id,
            "choice": job.choice,
        },
    )
    return generation


def generation_insert(*, job: GenerationJob, cache_lookup_ms: float | None = None) -> Generation:
    """The record of a request made just now, its id new: one INSERT, where generation_create
    looks for a resubmission's record first. `cache_lookup_ms`: the result cache looked the
    request up and missed, in that long (noted with it rather than by generation_cache_note)."""
    return Generation.objects.create(
        request_id=job.request_id,
        origin=job.origin,
        variant=job.variant,
        model=job.model,
        tier=job.tier,
        client_id=job.client_id,
        choice=job.choice,
        cache=CacheResult.MISS if cache_lookup_ms is not None else "",
        cache_lookup_ms=cache_lookup_ms,
    )


def generation_cache_note(*, request_id: str, result: str, lookup_ms: float) -> None:
    """Record that the result cache looked this request up and missed (a hit is recorded
    whole by admission.request_answer_known)."""
    Generation.objects.filter(request_id=request_id).update(cache=result, cache_lookup_ms=lookup_ms)


def generations_text_forget(*, request_ids: QuerySet | Sequence[str]) -> int:
    """Forget what these generations said (their text, error message and grounding report),
    keeping their timings and outcome for the figures: their conversation was purged."""
    forgotten = Generation.objects.filter(request_id__in=request_ids)
    return forgotten.update(text="", error_message="", grounding=None)


def generation_discard(*, request_id: str, answered_by: str = "") -> None:
    """Forget a request that was not admitted: its pending record, and with `answered_by` also
    the record that engine (an answer known without a worker: scheduler.admission.KnownAnswer)
    finished before the answer's stream could be written."""
    unadmitted = Q(status=Generation.Status.PENDING)
    if answered_by:
        unadmitted |= Q(engine=answered_by)
    Generation.objects.filter(unadmitted, request_id=request_id).delete()


def generation_finish(*, request_id: str, outcome: GenerationOutcome) -> bool:
    """Store how the generation ended. Idempotent on request_id: a replayed finish changes
    nothing and returns False (as it does for a record that no longer exists). PostgreSQL stores
    no NUL character: one in the text (a model can emit it; the simulated engine echoes the
    prompt) is stored as U+FFFD, or the answer would be lost."""
    timings = outcome.timings
    cached = {}
    if outcome.cache:
        cached = {
            "cache": outcome.cache,
            "cache_lookup_ms": timings.ttft_ms if timings else None,
            "saved_engine_ms": outcome.saved_engine_ms,
        }
    updated = Generation.objects.filter(request_id=request_id, status=Generation.Status.PENDING).update(
        **cached,
        status=outcome.status,
        text=outcome.text.replace("\x00", "\ufffd"),
        finish_reason=outcome.finish_reason,
        error_code=outcome.error_code,
        error_message=outcome.error_message,
        prompt_tokens=outcome.usage.prompt_tokens,
        completion_tokens=outcome.usage.completion_tokens,
        queue_ms=timings.queue_ms if timings else None,
        ttft_ms=timings.ttft_ms if timings else None,
        duration_ms=timings.duration_ms if timings else None,
        engine=timings.engine if timings else "",
        grounding=outcome.grounding.to_dict() if outcome.grounding is not None else None,
        finished_at=timezone.now(),
    )
    return updated == 1


def generations_finish(finished: Sequence[tuple[str, GenerationOutcome]]) -> list[bool]:
    """generation_finish for several generations in one transaction, in order: a worker stores
    the answers that ended together with one commit (on SQLite a commit was most of the cost of
    storing one; storing 1000 answers that ended at once, one commit each, took a third of
    the worker's time)."""
    with transaction.atomic():
        return [generation_finish(request_id=request_id, outcome=outcome) for request_id, outcome in finished]
