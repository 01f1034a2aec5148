"""Quality scores of a variant: recording one (the canary page) and running it (a Celery task)."""

from __future__ import annotations

import asyncio

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import User
from admin_console.models import QualityRun
from admin_console.selectors import quality as quality_selectors
from admin_console.services.audit import ConsoleError
from knowledge.quality import (
    Answerer,
    QualityScore,
    VariantSettings,
    answers_collect,
    conversations_load,
    queue_answerer,
)
from scheduler.models import Variant
from scheduler.workers import live_workers


def quality_run_start(*, actor: User, variant: str) -> QualityRun:
    """Record a new quality score of `variant` with its settings as stored now, to be run by
    admin_console.tasks.quality_run.

    Raises ConsoleError for a variant that does not exist, while a score of the variant is still
    running, or when no live worker serves its model (its questions would wait in the queue
    until the run timed out).
    """
    row = Variant.objects.filter(name=variant).first()
    if row is None:
        raise ConsoleError(f"No variant {variant!r}.")
    answered_by_model = row.answer_style != Variant.AnswerStyle.EXTRACTIVE
    if answered_by_model and row.model not in {
        w.model for w in live_workers() if not w.state.get("draining")
    }:
        raise ConsoleError(
            f"No live worker serves {variant!r} (model {row.model!r}): its questions would go unanswered."
        )
    with transaction.atomic():
        running = quality_selectors.quality_run_running(variant=variant)
        if running is not None:
            raise ConsoleError(
                f"A quality score of {variant} is running already ({running.answered} answered)."
            )
        return QualityRun.objects.create(
            variant=variant,
            variant_settings=VariantSettings.of(row).as_dict(),
            started_by=actor,
        )


def quality_run_execute(*, run_id: int, answerer: Answerer | None = None) -> QualityRun:
    """Ask the run's variant every quality question (by default through the queue, answered by
    its live workers) and store the score; a run that cannot finish within
    QUALITY_RUN_TIMEOUT_S is stored as failed."""
    run = QualityRun.objects.get(pk=run_id)
    variant = VariantSettings(**run.variant_settings)
    conversations = conversations_load()
    QualityRun.objects.filter(pk=run_id).update(questions=sum(len(c.turns) for c in conversations))

    async def progress(done: int, total: int) -> None:
        await database_sync_to_async(QualityRun.objects.filter(pk=run_id).update)(answered=done)

    async def collect() -> QualityScore:
        async with asyncio.timeout(settings.QUALITY_RUN_TIMEOUT_S):
            return await answers_collect(
                conversations,
                variant=variant,
                answerer=answerer or queue_answerer(variant=variant.name, model=variant.model),
                progress=progress,
            )

    try:
        score = asyncio.run(collect())
    except TimeoutError:
        _quality_run_fail(
            run_id, f"Not finished within {settings.QUALITY_RUN_TIMEOUT_S:g} s: are its workers up?"
        )
    except Exception as exc:
        _quality_run_fail(run_id, f"{type(exc).__name__}: {exc}")
        raise
    else:
        QualityRun.objects.filter(pk=run_id).update(
            status=QualityRun.Status.DONE,
            overall=score.overall,
            breakdown=score.breakdown(),
            answered=score.questions,
            finished_at=timezone.now(),
        )
    run.refresh_from_db()
    return run


def _quality_run_fail(run_id: int, error: str) -> None:
    QualityRun.objects.filter(pk=run_id).update(
        status=QualityRun.Status.FAILED, error=error, finished_at=timezone.now()
    )
