"""Writes for the console: rate-limit policies, model variants, pinned answers, the canary,
worker drains, API keys and their limits, help articles, agents' work on conversations handed
off to a person, and A/B experiments.

Every change lands in the audit log (who, when, before, after) and reaches the scheduler's
Redis mirror right after it commits, so it applies within a second without a restart.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import User
from admin_console import selectors
from admin_console.models import AuditLog, CanaryRollout, QualityRun
from api import keys as api_keys
from api.keys import IssuedApiKey
from api.models import ApiKey
from chat import handoff
from chat.models import AgentNote, AgentProfile, Conversation, HandoffSettings, Message
from knowledge import cache as answer_cache
from knowledge import selectors as knowledge_selectors
from knowledge import services as knowledge_services
from knowledge.models import Article, CachedAnswer
from knowledge.quality import (
    Answerer,
    QualityScore,
    VariantSettings,
    answers_collect,
    conversations_load,
    queue_answerer,
)
from scheduler import control, fair_share
from scheduler.models import CanaryRouting, Experiment, SourceWeight, TierPolicy, Variant, WarmPool
from scheduler.policy import policies_mirror
from scheduler.routing import canary_mirror, experiment_mirror
from scheduler.warmpool import spares_mirror
from scheduler.workers import live_workers

# Who the audit log names for changes the canary's evaluation makes on its own.
EVALUATION_ACTOR_NAME = "canary evaluation"

POLICY_FIELDS = tuple(f.name for f in TierPolicy._meta.fields if f.name not in {"tier", "updated_at"})
VARIANT_FIELDS = (
    "model",
    "system_prompt",
    "temperature",
    "top_p",
    "frequency_penalty",
    "max_tokens",
    "knowledge",
    "answer_style",
    "tool_call_parser",
    "description",
)
CANARY_RULE_FIELDS = (
    "max_error_rate_increase_points",
    "max_ttft_p95_ratio",
    "max_thumbs_down_increase_points",
    "min_answers",
    "min_votes",
    "window_s",
)


class ConsoleError(ValueError):
    """A change that cannot be made in the current state; the message says why."""


def _audit(
    *,
    actor: User | None,
    action: AuditLog.Action,
    target: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    unattended_by: str = EVALUATION_ACTOR_NAME,
) -> AuditLog:
    """`unattended_by` names who made a change without an account (`actor` None)."""
    return AuditLog.objects.create(
        actor=actor,
        actor_name=actor.get_username() if actor is not None else unattended_by,
        action=action,
        target=target,
        before=before,
        after=after,
    )


# --- rate limits ------------------------------------------------------------------------------------


def _policy_values(policy: TierPolicy) -> dict[str, Any]:
    return {name: getattr(policy, name) for name in POLICY_FIELDS}


def policy_update(*, actor: User, tier: str, changes: dict[str, Any]) -> TierPolicy:
    """Change a tier's policy. Raises TierPolicy.DoesNotExist or ValidationError."""
    with transaction.atomic():
        policy = TierPolicy.objects.select_for_update().get(tier=tier)
        before = _policy_values(policy)
        for name in POLICY_FIELDS:
            if name in changes:
                setattr(policy, name, changes[name])
        policy.full_clean()
        after = _policy_values(policy)
        if after == before:
            return policy
        policy.save()
        _audit(actor=actor, action=AuditLog.Action.POLICY_UPDATE, target=tier, before=before, after=after)
    policies_mirror()
    return policy


FAIR_SHARE_TARGET = "fair share"  # the audit log's name for the weights per origin


def source_weights_set(*, actor: User, weights: dict[str, float]) -> bool:
    """Set the fair share's weight of each origin named in `weights` (scheduler/fair_share.py);
    every web process applies it within a second. False when nothing changed. Raises
    ValidationError."""
    with transaction.atomic():
        before = selectors.source_weights()
        changed = {origin: weight for origin, weight in weights.items() if before.get(origin) != weight}
        if not changed:
            return False
        for origin, weight in changed.items():
            row = SourceWeight(origin=origin, weight=weight)
            row.full_clean(validate_unique=False)
            row.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.POLICY_UPDATE,
            target=FAIR_SHARE_TARGET,
            before=before,
            after=before | changed,
        )
    fair_share.weights_forget()
    return True


# --- model variants ---------------------------------------------------------------------------------


def _variant_values(variant: Variant) -> dict[str, Any]:
    return {name: getattr(variant, name) for name in VARIANT_FIELDS}


def variant_create(*, actor: User, name: str, values: dict[str, Any]) -> Variant:
    """Add a variant; the canary can try it once a live worker serves its model. Raises
    ValidationError (a field, or the name taken)."""
    with transaction.atomic():
        variant = Variant(name=name, **{field: values[field] for field in VARIANT_FIELDS if field in values})
        variant.full_clean()
        variant.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.VARIANT_CREATE,
            target=name,
            before=None,
            after=_variant_values(variant),
        )
    return variant


def variant_update(*, actor: User, name: str, changes: dict[str, Any]) -> Variant:
    """Change a variant: the questions routed to it from then on (within a second in every web
    process: scheduler.routing) are asked its new way; answers already queued keep the prompt and
    sampling they were queued with. Raises Variant.DoesNotExist or ValidationError."""
    with transaction.atomic():
        variant = Variant.objects.select_for_update().get(name=name)
        before = _variant_values(variant)
        for field in VARIANT_FIELDS:
            if field in changes:
                setattr(variant, field, changes[field])
        variant.full_clean()
        after = _variant_values(variant)
        if after == before:
            return variant
        variant.save()
        _audit(actor=actor, action=AuditLog.Action.VARIANT_UPDATE, target=name, before=before, after=after)
    return variant


# --- result cache ---------------------------------------------------------------------------------


def cached_answer_pin(*, actor: User, variant: str, question: str, answer: str) -> CachedAnswer:
    """Serve `answer` to `question` (and its paraphrases) in chat on `variant`, whatever the
    help center says, until unpinned. Raises ConsoleError (no such variant, or the text holds
    personal data, which the cache never serves)."""
    question, answer = question.strip(), answer.strip()
    target = Variant.objects.filter(name=variant).first()
    if target is None:
        raise ConsoleError(f"There is no variant {variant!r}.")
    if answer_cache.question_personal(question) or answer_cache.answer_personal(answer):
        raise ConsoleError(
            "The cache never serves personal data: leave out names, emails, numbers, addresses and codes."
        )
    try:
        vector = knowledge_selectors.question_vector(question)
    except knowledge_selectors.EmbedderUnavailable as exc:
        raise ConsoleError("The embedding model is not prepared: run `manage.py prepare_embedder`.") from exc
    with transaction.atomic():
        entry = answer_cache.answer_pin(
            variant=target, question=question, answer=answer, pinned_by=actor.get_username(), vector=vector
        )
        _audit(
            actor=actor,
            action=AuditLog.Action.ANSWER_PIN,
            target=variant,
            before=None,
            after={"question": question, "answer": answer},
        )
    return entry


def cached_answer_unpin(*, actor: User, entry_id: int) -> None:
    """Stop serving a pinned answer. Raises CachedAnswer.DoesNotExist."""
    with transaction.atomic():
        entry = CachedAnswer.objects.exclude(pinned_answer="").get(pk=entry_id)
        before = {"question": entry.question, "answer": entry.pinned_answer}
        entry.delete()
        _audit(
            actor=actor, action=AuditLog.Action.ANSWER_UNPIN, target=entry.variant, before=before, after=None
        )


# --- canary -----------------------------------------------------------------------------------------


def _routing_locked() -> CanaryRouting:
    return CanaryRouting.objects.select_for_update().get(pk=CanaryRouting.load().pk)


def _routing_values(routing: CanaryRouting) -> dict[str, Any]:
    return {
        "stable_variant": routing.stable_variant,
        "candidate_variant": routing.candidate_variant,
        "split_percent": routing.split_percent,
    }


def _running_locked() -> CanaryRollout:
    rollout = CanaryRollout.objects.select_for_update().filter(status=CanaryRollout.Status.RUNNING).first()
    if rollout is None:
        raise ConsoleError("No canary is running.")
    return rollout


def canary_start(
    *, actor: User, candidate_variant: str, steps: list[dict[str, int]], rules: dict[str, Any]
) -> CanaryRollout:
    """Start sending the plan's first share of new conversations to `candidate_variant`.

    Raises ConsoleError (a canary runs already, no live worker serves the candidate's model) or
    ValidationError (the plan or rules).
    """
    serving = {w.model for w in live_workers() if not w.state.get("draining")}
    with transaction.atomic():
        routing = _routing_locked()
        if selectors.running_rollout() is not None:
            raise ConsoleError("A canary is already running: promote it or roll it back first.")
        if candidate_variant == routing.stable_variant:
            raise ConsoleError(f"{candidate_variant} is the stable variant already.")
        candidate = Variant.objects.filter(name=candidate_variant).first()
        if candidate is None:
            raise ConsoleError(f"There is no variant {candidate_variant!r}.")
        if candidate.model not in serving:
            raise ConsoleError(
                f"No live worker serves {candidate.model!r}, the model of {candidate_variant!r}: "
                f"start one with INFERENCE_MODEL_NAME={candidate.model} first."
            )
        before = _routing_values(routing)
        rollout = CanaryRollout(
            stable_variant=routing.stable_variant,
            candidate_variant=candidate_variant,
            steps=steps,
            step_started_at=timezone.now(),
            started_by=actor,
            **{name: rules[name] for name in CANARY_RULE_FIELDS if name in rules},
        )
        rollout.full_clean()
        rollout.save()
        routing.candidate_variant = candidate_variant
        routing.split_percent = steps[0]["percent"]
        # A new salt: each canary tries a different share of conversations.
        routing.salt = secrets.token_hex(8)
        routing.save()
        plan = {"steps": steps, **{name: getattr(rollout, name) for name in CANARY_RULE_FIELDS}}
        _audit(
            actor=actor,
            action=AuditLog.Action.CANARY_START,
            target=candidate_variant,
            before=before,
            after={**_routing_values(routing), **plan},
        )
    canary_mirror()
    return rollout


def canary_split_set(*, actor: User, percent: int) -> CanaryRouting:
    """Move the running canary's split by hand. The plan carries on from the new split after
    its hold (a split of 0 keeps the candidate idle until changed again)."""
    if not 0 <= percent <= 100:
        raise ConsoleError("The split is a percentage from 0 to 100.")
    with transaction.atomic():
        rollout = _running_locked()
        routing = _routing_locked()
        before = _routing_values(routing)
        _split_move(rollout, routing, percent, at=timezone.now())
        _audit(
            actor=actor,
            action=AuditLog.Action.CANARY_SPLIT,
            target=rollout.candidate_variant,
            before=before,
            after=_routing_values(routing),
        )
    canary_mirror()
    return routing


def _split_move(rollout: CanaryRollout, routing: CanaryRouting, percent: int, *, at: datetime) -> None:
    routing.split_percent = percent
    routing.save(update_fields=["split_percent", "updated_at"])
    rollout.step_started_at = at
    rollout.save(update_fields=["step_started_at"])


def canary_promote(*, actor: User | None) -> CanaryRollout:
    """Make the candidate the stable variant for every new conversation; the canary ends."""
    with transaction.atomic():
        rollout = _running_locked()
        gate = selectors.quality_gate(
            stable_variant=rollout.stable_variant, candidate_variant=rollout.candidate_variant
        )
        if not gate.passed:
            raise ConsoleError(gate.reason)
        _promote(rollout, _routing_locked(), actor=actor)
    canary_mirror()
    return rollout


def _promote(rollout: CanaryRollout, routing: CanaryRouting, *, actor: User | None) -> None:
    before = _routing_values(routing)
    routing.stable_variant = rollout.candidate_variant
    routing.candidate_variant = ""
    routing.split_percent = 0
    routing.save()
    rollout.status = CanaryRollout.Status.PROMOTED
    rollout.ended_at = timezone.now()
    rollout.automatic = actor is None
    rollout.save()
    _audit(
        actor=actor,
        action=AuditLog.Action.CANARY_PROMOTE,
        target=rollout.candidate_variant,
        before=before,
        after=_routing_values(routing),
    )


def canary_rollback(*, actor: User) -> CanaryRollout:
    """Send every new conversation back to stable at once; the canary ends."""
    with transaction.atomic():
        rollout = _running_locked()
        routing = _routing_locked()
        numbers = _comparison_record(rollout, routing, now=timezone.now())
        _rollback(rollout, routing, actor=actor, reason="manual", numbers=numbers)
    canary_mirror()
    return rollout


def _rollback(
    rollout: CanaryRollout,
    routing: CanaryRouting,
    *,
    actor: User | None,
    reason: str,
    numbers: dict[str, Any],
) -> None:
    before = _routing_values(routing)
    routing.candidate_variant = ""
    routing.split_percent = 0
    routing.save()
    rollout.status = CanaryRollout.Status.ROLLED_BACK
    rollout.ended_at = timezone.now()
    rollout.automatic = actor is None
    rollout.rollback_reason = reason
    rollout.rollback_numbers = numbers
    rollout.save()
    _audit(
        actor=actor,
        action=AuditLog.Action.CANARY_ROLLBACK,
        target=rollout.candidate_variant,
        before=before,
        after={**_routing_values(routing), "reason": reason},
    )


def _comparison_record(
    rollout: CanaryRollout,
    routing: CanaryRouting,
    *,
    now: datetime,
    comparison: tuple[selectors.VariantStats, selectors.VariantStats] | None = None,
) -> dict[str, Any]:
    stable, candidate = comparison or selectors.canary_comparison(rollout=rollout, now=now)
    checks = selectors.rule_checks(rollout=rollout, stable=stable, candidate=candidate)
    return {
        "evaluated_at": now.isoformat(),
        "split_percent": routing.split_percent,
        "stable": stable.as_record(),
        "candidate": candidate.as_record(),
        "checks": [
            {"rule": c.rule, "stable": c.stable, "candidate": c.candidate, "limit": c.limit, "state": c.state}
            for c in checks
        ],
    }


def canary_evaluate(*, now: datetime | None = None) -> str:
    """One evaluation of the running canary (the Celery beat task runs it periodically).

    A broken rule rolls the candidate back and records the numbers; otherwise, once the
    current split has been held long enough and the candidate has enough answers to judge,
    the split moves to the plan's next step, or past the last step the candidate is promoted.
    Promotion also needs the candidate's latest quality score to be at least stable's.
    Returns what happened: idle, rolled_back, advanced, promoted, awaiting_quality or holding.
    """
    now = now or timezone.now()
    with transaction.atomic():
        try:
            rollout = _running_locked()
        except ConsoleError:
            return "idle"
        routing = _routing_locked()
        stable, candidate = selectors.canary_comparison(rollout=rollout, now=now)
        checks = selectors.rule_checks(rollout=rollout, stable=stable, candidate=candidate)
        breached = [check.rule for check in checks if check.breached]
        held = now >= rollout.step_started_at + timedelta(seconds=rollout.hold_s(routing.split_percent))
        if breached:
            numbers = _comparison_record(rollout, routing, now=now, comparison=(stable, candidate))
            _rollback(rollout, routing, actor=None, reason=", ".join(breached), numbers=numbers)
            outcome = "rolled_back"
        elif held and candidate.answers >= rollout.min_answers:
            next_percent = rollout.next_percent(routing.split_percent)
            if next_percent is None:
                gate = selectors.quality_gate(
                    stable_variant=rollout.stable_variant, candidate_variant=rollout.candidate_variant
                )
                if not gate.passed:
                    # The candidate keeps its split until a score lets it through, or staff end it.
                    return "awaiting_quality"
                _promote(rollout, routing, actor=None)
                outcome = "promoted"
            else:
                before = _routing_values(routing)
                _split_move(rollout, routing, next_percent, at=now)
                _audit(
                    actor=None,
                    action=AuditLog.Action.CANARY_SPLIT,
                    target=rollout.candidate_variant,
                    before=before,
                    after=_routing_values(routing),
                )
                outcome = "advanced"
        else:
            return "holding"
    canary_mirror()
    return outcome


# --- quality scores -----------------------------------------------------------------------------


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
        running = selectors.quality_run_running(variant=variant)
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


# --- workers ----------------------------------------------------------------------------------------


def worker_drain(*, actor: User, worker_id: str) -> None:
    """Ask a live worker to stop claiming; its running answers finish, then it exits."""
    worker = next((w for w in live_workers() if w.worker_id == worker_id), None)
    if worker is None:
        raise ConsoleError(f"No live worker {worker_id!r}: it may have stopped already.")
    control.worker_drain(worker_id=worker_id)
    _audit(
        actor=actor,
        action=AuditLog.Action.WORKER_DRAIN,
        target=worker_id,
        before={"model": worker.model, "draining": bool(worker.state.get("draining"))},
        after={"model": worker.model, "draining": True},
    )


def warm_spares_set(*, actor: User, spares: int) -> WarmPool:
    """Keep `spares` warm spare workers per model beyond those it needs (0: no pool)."""
    with transaction.atomic():
        pool = WarmPool.objects.select_for_update().get(pk=WarmPool.load().pk)
        before = {"spares": pool.spares}
        pool.spares = spares
        pool.full_clean()
        if pool.spares == before["spares"]:
            return pool
        pool.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.WARM_SPARES,
            target="warm pool",
            before=before,
            after={"spares": pool.spares},
        )
    spares_mirror()
    return pool


# --- API keys -----------------------------------------------------------------------------------
# `actor` None: a key managed from the command line (`manage.py apikey`), named as such.
COMMAND_LINE_ACTOR_NAME = "manage.py apikey"


def _api_key_values(api_key: ApiKey) -> dict[str, Any]:
    return {
        "owner": api_key.owner.get_username(),
        "name": api_key.name,
        "tier": api_key.tier or "owner's",
        "revoked": api_key.revoked_at is not None,
    }


def _api_key_limit_values(api_key: ApiKey) -> dict[str, Any]:
    return {
        "requests_per_minute": api_key.requests_per_minute,
        "tokens_per_minute": api_key.tokens_per_minute,
        "fair_share_weight": api_key.fair_share_weight,
    }


def api_key_create(*, actor: User | None, owner: User, name: str = "", tier: str = "") -> IssuedApiKey:
    with transaction.atomic():
        issued = api_keys.api_key_create(owner=owner, name=name, tier=tier)
        _audit(
            actor=actor,
            action=AuditLog.Action.API_KEY_CREATE,
            target=issued.api_key.prefix,
            before=None,
            after=_api_key_values(issued.api_key),
            unattended_by=COMMAND_LINE_ACTOR_NAME,
        )
    return issued


def api_key_revoke(*, actor: User | None, api_key: ApiKey) -> bool:
    """False when the key was already revoked (nothing to audit)."""
    with transaction.atomic():
        before = _api_key_values(api_key)
        revoked = api_keys.api_key_revoke(api_key=api_key)
        if revoked:
            _audit(
                actor=actor,
                action=AuditLog.Action.API_KEY_REVOKE,
                target=api_key.prefix,
                before=before,
                after=_api_key_values(api_key),
                unattended_by=COMMAND_LINE_ACTOR_NAME,
            )
    return revoked


def api_key_limits_set(
    *,
    actor: User | None,
    api_key: ApiKey,
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
    fair_share_weight: float | None,
) -> bool:
    """Set the key's own limits (None: unlimited) and its fair-share weight (None: the API's);
    they apply to its next request, since admission reads them from the key each time. False
    when nothing changed. Raises ValidationError."""
    with transaction.atomic():
        locked = ApiKey.objects.select_for_update().get(pk=api_key.pk)
        before = _api_key_limit_values(locked)
        locked.requests_per_minute = requests_per_minute
        locked.tokens_per_minute = tokens_per_minute
        locked.fair_share_weight = fair_share_weight
        locked.full_clean(validate_unique=False, validate_constraints=False)
        after = _api_key_limit_values(locked)
        if after == before:
            return False
        locked.save(update_fields=["requests_per_minute", "tokens_per_minute", "fair_share_weight"])
        _audit(
            actor=actor,
            action=AuditLog.Action.API_KEY_LIMITS,
            target=locked.prefix,
            before=before,
            after=after,
            unattended_by=COMMAND_LINE_ACTOR_NAME,
        )
    api_key.requests_per_minute, api_key.tokens_per_minute = requests_per_minute, tokens_per_minute
    api_key.fair_share_weight = fair_share_weight
    return True


# --- help articles ------------------------------------------------------------------------------
# `actor` None: articles imported from Markdown files (`manage.py import_articles`).
IMPORT_ACTOR_NAME = "manage.py import_articles"


def _article_values(article: Article) -> dict[str, Any]:
    """The body by size and digest: the audit log says that it changed, the article says how."""
    return {
        "slug": article.slug,
        "title": article.title,
        "status": article.status,
        "language": article.language,
        "translation_of": article.translation_of.slug if article.translation_of else None,
        "body_chars": len(article.body),
        "body_sha256": hashlib.sha256(article.body.encode()).hexdigest()[:12],
    }


def article_create(
    *,
    actor: User | None,
    slug: str,
    title: str,
    body: str,
    language: str = Article.Language.EN,
    translation_of: Article | None = None,
) -> Article:
    """Raises ValidationError, or knowledge.embedding.EmbedderUnavailable."""
    with transaction.atomic():
        article = knowledge_services.article_create(
            slug=slug, title=title, body=body, language=language, translation_of=translation_of
        )
        _audit(
            actor=actor,
            action=AuditLog.Action.ARTICLE_CREATE,
            target=article.slug,
            before=None,
            after=_article_values(article),
            unattended_by=IMPORT_ACTOR_NAME,
        )
    return article


def article_update(*, actor: User | None, article: Article, slug: str, title: str, body: str) -> bool:
    """False when nothing changed. Raises ValidationError, or EmbedderUnavailable."""
    with transaction.atomic():
        before = _article_values(article)
        changed = knowledge_services.article_update(article=article, slug=slug, title=title, body=body)
        if changed:
            _audit(
                actor=actor,
                action=AuditLog.Action.ARTICLE_UPDATE,
                target=article.slug,
                before=before,
                after=_article_values(article),
                unattended_by=IMPORT_ACTOR_NAME,
            )
    return changed


def article_status_set(*, actor: User | None, article: Article, status: Article.Status) -> bool:
    """Retire or restore an article; False when it already had that status."""
    with transaction.atomic():
        before = _article_values(article)
        changed = knowledge_services.article_status_set(article=article, status=status)
        if changed:
            _audit(
                actor=actor,
                action=(
                    AuditLog.Action.ARTICLE_RETIRE
                    if status == Article.Status.RETIRED
                    else AuditLog.Action.ARTICLE_RESTORE
                ),
                target=article.slug,
                before=before,
                after=_article_values(article),
                unattended_by=IMPORT_ACTOR_NAME,
            )
    return changed


# --- hand-off to a person: everything an agent does is audited ---------------------------------------
# The transitions and their rules are chat.handoff's; here each one is recorded with who did it.


def handoff_claim(*, agent: User, conversation_id: UUID) -> Conversation:
    """Raises handoff.HandoffConflict (another agent won, or at capacity) or handoff.NotAnAgent."""
    with transaction.atomic():
        conversation = handoff.conversation_claim(conversation_id=conversation_id, agent=agent)
        _audit(
            actor=agent,
            action=AuditLog.Action.HANDOFF_CLAIM,
            target=str(conversation_id),
            before={"state": Conversation.HandoffState.WAITING},
            after={"state": conversation.handoff_state, "agent": handoff.agent_display_name(agent)},
        )
    return conversation


def handoff_reply(*, agent: User, conversation_id: UUID, text: str) -> Message:
    """Raises handoff.HandoffRejected (empty, too long) or handoff.HandoffConflict."""
    with transaction.atomic():
        message = handoff.agent_reply(conversation_id=conversation_id, agent=agent, text=text)
        _audit(
            actor=agent,
            action=AuditLog.Action.HANDOFF_REPLY,
            target=str(conversation_id),
            before=None,
            after={"message": message.pk, "as": message.author_name, "chars": len(message.content)},
        )
    return message


def handoff_note(*, agent: User, conversation_id: UUID, text: str) -> AgentNote:
    with transaction.atomic():
        note = handoff.agent_note(conversation_id=conversation_id, agent=agent, text=text)
        _audit(
            actor=agent,
            action=AuditLog.Action.HANDOFF_NOTE,
            target=str(conversation_id),
            before=None,
            after={"note": note.pk, "chars": len(note.text)},
        )
    return note


def handoff_hand_back(*, agent: User, conversation_id: UUID) -> None:
    with transaction.atomic():
        handoff.handoff_hand_back(conversation_id=conversation_id, agent=agent)
        _audit(
            actor=agent,
            action=AuditLog.Action.HANDOFF_HAND_BACK,
            target=str(conversation_id),
            before={"state": Conversation.HandoffState.AGENT},
            after={"state": Conversation.HandoffState.ASSISTANT},
        )


def handoff_resolve(*, agent: User, conversation_id: UUID) -> None:
    with transaction.atomic():
        handoff.handoff_resolve(conversation_id=conversation_id, agent=agent)
        _audit(
            actor=agent,
            action=AuditLog.Action.HANDOFF_RESOLVE,
            target=str(conversation_id),
            before={"state": Conversation.HandoffState.AGENT},
            after={"state": Conversation.HandoffState.RESOLVED},
        )


def agent_profile_set(*, agent: User, display_name: str, capacity: int) -> AgentProfile:
    """The agent's own name for customers and how many conversations they take at once.
    Raises ValidationError."""
    handoff.agent_check(agent)
    with transaction.atomic():
        profile = AgentProfile.objects.select_for_update().get(pk=handoff.agent_profile(agent).pk)
        before = {"display_name": profile.display_name, "capacity": profile.capacity}
        profile.display_name, profile.capacity = display_name.strip(), capacity
        profile.full_clean()
        after = {"display_name": profile.display_name, "capacity": profile.capacity}
        if after == before:
            return profile
        profile.save()
        _audit(
            actor=agent,
            action=AuditLog.Action.AGENT_PROFILE,
            target=agent.get_username(),
            before=before,
            after=after,
        )
    return profile


def handoff_target_set(*, actor: User, first_response_target_s: int) -> HandoffSettings:
    """The first-response target the inbox colours waiting conversations against. Raises
    ValidationError."""
    with transaction.atomic():
        row = HandoffSettings.objects.select_for_update().get(pk=HandoffSettings.load().pk)
        before = {"first_response_target_s": row.first_response_target_s}
        row.first_response_target_s = first_response_target_s
        row.full_clean()
        if row.first_response_target_s == before["first_response_target_s"]:
            return row
        row.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.HANDOFF_TARGET,
            target="first response",
            before=before,
            after={"first_response_target_s": row.first_response_target_s},
        )
    return row


# --- A/B experiments ----------------------------------------------------------------------------------


def _experiment_values(experiment: Experiment) -> dict[str, Any]:
    return {
        "variant_a": experiment.variant_a,
        "variant_b": experiment.variant_b,
        "split_percent": experiment.split_percent,
        "status": experiment.status,
        "kept_variant": experiment.kept_variant,
    }


def experiment_start(*, actor: User, variant_a: str, variant_b: str, split_percent: int) -> Experiment:
    """Split customers between two variants, `split_percent` of them on the first, until staff
    keep one. Raises ConsoleError (one runs already, a variant does not exist or no live worker
    serves its model) or ValidationError."""
    serving = {w.model for w in live_workers() if not w.state.get("draining")}
    with transaction.atomic():
        if Experiment.objects.select_for_update().filter(status=Experiment.Status.RUNNING).exists():
            raise ConsoleError("An experiment is already running: keep one of its arms first.")
        models = dict(Variant.objects.filter(name__in=[variant_a, variant_b]).values_list("name", "model"))
        for name in (variant_a, variant_b):
            if name not in models:
                raise ConsoleError(f"There is no variant {name!r}.")
            if models[name] not in serving:
                raise ConsoleError(f"No live worker serves {models[name]!r}, the model of {name!r}.")
        experiment = Experiment(
            variant_a=variant_a, variant_b=variant_b, split_percent=split_percent, salt=secrets.token_hex(8)
        )
        experiment.full_clean()
        experiment.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.EXPERIMENT_START,
            target=f"{variant_a} vs {variant_b}",
            before=None,
            after=_experiment_values(experiment),
        )
    experiment_mirror()
    return experiment


def experiment_end(*, actor: User, keep: str) -> Experiment:
    """End the running experiment by keeping one arm: that variant answers every customer from
    now on (it becomes the stable variant). Raises ConsoleError when none runs, `keep` is not
    one of its arms, or a canary runs against another stable variant (end that first)."""
    with transaction.atomic():
        experiment = Experiment.objects.select_for_update().filter(status=Experiment.Status.RUNNING).first()
        if experiment is None:
            raise ConsoleError("No experiment is running.")
        if keep not in experiment.arms:
            raise ConsoleError(f"{keep!r} is not one of the experiment's variants.")
        routing = _routing_locked()
        if keep != routing.stable_variant and selectors.running_rollout() is not None:
            raise ConsoleError(
                "A canary is running against the stable variant: promote it or roll it back first."
            )
        before = {**_experiment_values(experiment), "stable_variant": routing.stable_variant}
        experiment.status = Experiment.Status.ENDED
        experiment.kept_variant = keep
        experiment.ended_at = timezone.now()
        experiment.save()
        routing.stable_variant = keep
        routing.save()
        _audit(
            actor=actor,
            action=AuditLog.Action.EXPERIMENT_END,
            target=f"{experiment.variant_a} vs {experiment.variant_b}",
            before=before,
            after={**_experiment_values(experiment), "stable_variant": keep},
        )
    canary_mirror()
    experiment_mirror()
    return experiment
