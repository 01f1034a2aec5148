"""Writes of the result cache page: pinning an answer to a question, and unpinning it."""

from __future__ import annotations

from django.db import transaction

from accounts.models import User
from admin_console.models import AuditLog
from admin_console.services.audit import ConsoleError, _audit
from knowledge import cache as answer_cache
from knowledge import selectors as knowledge_selectors
from knowledge.models import CachedAnswer
from scheduler.models import Variant


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
