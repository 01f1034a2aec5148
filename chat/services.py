"""Writes for the chat: every change to conversations and messages goes through here."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

import numpy as np
from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.crypto import constant_time_compare, salted_hmac

from accounts.models import User
from chat import handoff
from chat.models import Conversation, Message
from knowledge import cache as answer_cache
from knowledge import selectors as knowledge_selectors
from knowledge.answers import answer_plan
from knowledge.history import window_start
from scheduler import control
from scheduler.admission import Admission, request_admit, request_admit_known
from scheduler.generation import GenerationJob, Origin, Tier
from scheduler.models import CacheResult, Generation, Variant
from scheduler.routing import variant_for_conversation
from scheduler.services import generation_insert, generations_text_forget


class MessageRejected(ValueError):
    """The text cannot be sent as it is (empty, too long)."""


class ConversationBusy(RuntimeError):
    """An answer is still being generated in this conversation."""


class FeedbackRejected(ValueError):
    """Only a finished answer can be rated."""


@dataclass(frozen=True, slots=True)
class PostedMessage:
    user_message: Message
    assistant_message: Message
    admission: Admission


# A new conversation is stored with its first message, never before: a visit, or a press of
# "New chat", writes nothing. Until then its id is an offer, recognisable by a keyed hash in
# its last 8 bytes, so that an id nobody was offered stays unknown (404).
_OFFER_SALT = "chat.conversation-offer"


def _offer_tag(nonce: bytes) -> bytes:
    return salted_hmac(_OFFER_SALT, nonce, algorithm="sha256").digest()[:8]


def conversation_id_offer() -> UUID:
    """An id for a conversation that comes to exist when a first message is posted to it."""
    nonce = uuid.uuid4().bytes[:8]
    return UUID(bytes=nonce + _offer_tag(nonce))


def conversation_id_offered(conversation_id: UUID) -> bool:
    raw = conversation_id.bytes
    return constant_time_compare(raw[8:], _offer_tag(raw[:8]))


def conversation_new(*, conversation_id: UUID, owner: User | None, session_key: str) -> Conversation:
    """An offered conversation, not yet saved: message_post saves it with its first message."""
    if owner is not None and owner.is_authenticated:
        return Conversation(id=conversation_id, owner=owner)
    return Conversation(id=conversation_id, session_key=session_key)


def _conversation_insert(conversation: Conversation) -> None:
    try:
        conversation.save(force_insert=True)
    except IntegrityError as exc:
        # The first message of the same new conversation, posted twice at once: one wins.
        raise ConversationBusy("Please wait for the current answer, or stop it, first.") from exc


def _validated_text(text: str) -> str:
    text = text.strip()
    if not text:
        raise MessageRejected("Please type a message first.")
    if "\x00" in text:
        raise MessageRejected("Messages cannot contain NUL characters.")
    if len(text) > settings.CHAT_MAX_MESSAGE_CHARS:
        raise MessageRejected(
            f"Messages can be at most {settings.CHAT_MAX_MESSAGE_CHARS} characters "
            f"(this one has {len(text)})."
        )
    return text


@dataclass(frozen=True, slots=True)
class _CacheLookup:
    """The result cache looked up for a conversation's first message: what it found, and what
    remembering a miss needs."""

    context: str
    vector: np.ndarray
    lookup: answer_cache.Lookup
    customer: str  # answer_cache.customer_key


def _first_turn(conversation: Conversation) -> bool:
    return conversation._state.adding or not conversation.messages.exists()


def _cache_lookup(
    conversation: Conversation, text: str, variant: Variant, *, customer: str
) -> _CacheLookup | None:
    """The result cache's lookup for a conversation's first message, or None when the cache may
    not answer it: off, an extractive variant (its answers cost no model), personal data in it,
    or no embedding model."""
    if not settings.ANSWER_CACHE_ENABLED or variant.answer_style == Variant.AnswerStyle.EXTRACTIVE:
        return None
    if answer_cache.question_personal(text, names=answer_cache.account_names(conversation.owner)):
        return None
    try:
        vector = knowledge_selectors.question_vector(text)
    except knowledge_selectors.EmbedderUnavailable:
        return None  # the answer is the decline (knowledge.answers)
    context = answer_cache.chat_context(variant)
    lookup = answer_cache.answer_lookup(
        variant=variant.name, context=context, question=text, vector=vector, customer=customer
    )
    return _CacheLookup(context, vector, lookup, customer)


def _question_vector(text: str) -> np.ndarray | None:
    try:
        return knowledge_selectors.question_vector(text)
    except knowledge_selectors.EmbedderUnavailable:
        return None


def _history(conversation: Conversation) -> tuple[list[dict[str, str]], list[str]]:
    """The conversation so far as a model reads it (the customer's messages and the answers
    that finished, oldest first, at most CHAT_HISTORY_MESSAGES from a start that moves on in
    blocks: knowledge.history), and the articles the last answer quoted (its follow-up is
    likely about them)."""
    read = (
        conversation.messages.filter(Q(role=Message.Role.USER) | Q(generation__status=Generation.Status.DONE))
        .annotate(text=Coalesce("generation__text", "content"))
        .exclude(text="")
        .order_by("created_at", "id")
    )
    recent = list(read.values("role", "text", "sources")[window_start(read.count()) :])
    history = [{"role": message["role"], "content": message["text"]} for message in recent]
    answers = [message for message in recent if message["role"] == Message.Role.ASSISTANT]
    previous_sources = [source["slug"] for source in answers[-1]["sources"]] if answers else []
    return history, previous_sources


def message_post(
    *,
    conversation: Conversation,
    text: str,
    tier: Tier,
    client_id: str,
    client_address: str | None = None,
) -> PostedMessage | handoff.HeldMessage:
    """Persist the user's message and queue its answer; a new conversation (conversation_new)
    is saved with it. A conversation with a person, or a message asking for one, is kept for
    the agent instead, with no answer (chat.handoff.message_for_person).

    How it is answered is the variant's answer style's (knowledge.answers): the help center's
    own sentences, the decline or a greeting are answered at once without the model; a model's
    answer is queued (checked sentence by sentence by the worker for the verified style). A
    first message to a model may be answered from the result cache (knowledge.cache). Each way
    has the same record, messages and stream.

    Raises MessageRejected, ConversationBusy, or scheduler.admission.AdmissionRefused; on any
    refusal nothing of this message stays behind, nor a conversation saved for it.
    """
    text = _validated_text(text)
    held = handoff.message_for_person(conversation=conversation, text=text, tier=tier)
    if held is not None:
        return held
    request_id = uuid.uuid4()
    variant = variant_for_conversation(conversation_id=str(conversation.pk), customer_id=client_id)
    is_new = conversation._state.adding
    first = _first_turn(conversation)
    # The result cache and retrieval are CPU work: done before the transaction, they hold no lock.
    customer = answer_cache.customer_key(client_id=client_id, address=client_address)
    cached = _cache_lookup(conversation, text, variant, customer=customer) if first else None
    known = cached.lookup.answer if cached is not None else None
    plan = None
    if known is None:
        history, previous_sources = ([], []) if first else _history(conversation)
        plan = answer_plan(
            variant=variant,
            message=text,
            history=history,
            previous_sources=previous_sources,
            vector=cached.vector if cached is not None else None,
        )
        known = plan.known
    with transaction.atomic():
        if is_new:
            # Nobody sees the conversation before this commits: no answer can be in progress.
            _conversation_insert(conversation)
        else:
            _conversation_take_turn(conversation)
        if plan is None:  # from the cache: the record keeps the question alone
            assert cached is not None
            messages, sources = [{"role": "user", "content": text}], cached.lookup.sources
        elif known is not None:
            messages = [{"role": "user", "content": text}]
            sources = [source.as_dict() for source in plan.sources]
        else:
            messages, sources = plan.messages, [source.as_dict() for source in plan.sources]
        job = GenerationJob(
            request_id=str(request_id),
            origin=Origin.CHAT,
            messages=messages,
            sampling=variant.sampling(),
            client_id=client_id,
            tier=Tier(tier),
            variant=variant.name,
            model=variant.model,
            disconnect_grace_s=settings.STREAM_DISCONNECT_GRACE_S,
            grounding=plan.grounding if plan is not None else None,
            conversation_id=str(conversation.pk),
        )
        user_message, assistant_message = Message.objects.bulk_create(
            [
                Message(conversation=conversation, role=Message.Role.USER, content=text),
                Message(
                    conversation=conversation,
                    role=Message.Role.ASSISTANT,
                    generation_id=request_id,
                    sources=sources,
                ),
            ]
        )
        missed = cached is not None and cached.lookup.answer is None
        generation_insert(job=job, cache_lookup_ms=cached.lookup.lookup_ms if missed else None)
    try:
        if known is not None:
            admission = request_admit_known(job=job, answer=known, client_address=client_address)
        else:
            admission = request_admit(job=job, client_address=client_address)
    except Exception:
        with transaction.atomic():
            Message.objects.filter(pk__in=[user_message.pk, assistant_message.pk]).delete()
            if is_new:
                conversation.delete()
        raise
    if cached is not None and known is None:
        assert plan is not None
        answer_cache.answer_remember(
            variant=variant.name,
            context=cached.context,
            question=text,
            vector=cached.vector,
            kb_version=knowledge_selectors.knowledge_base_version()
            if plan.kb_version is None
            else plan.kb_version,
            help_center=variant.knowledge,
            source_slugs=[source["slug"] for source in sources],
            request_id=job.request_id,
            customer=cached.customer,
        )
    return PostedMessage(user_message, assistant_message, admission)


def _conversation_take_turn(conversation: Conversation) -> None:
    """Refuse a post to a stored conversation while an answer is in progress in it, else mark
    it as just used. One answer at a time: concurrent posts to a conversation take its row lock
    in turn, so each one's check sees the pending answer of the post before it. (SQLite has no
    row locks and ignores this; its immediate transactions take the database's write lock.)"""
    Conversation.objects.select_for_update(no_key=True).filter(pk=conversation.pk).exists()
    if _unfinished_answers(conversation).exists():
        raise ConversationBusy("Please wait for the current answer, or stop it, first.")
    Conversation.objects.filter(pk=conversation.pk).update(updated_at=timezone.now())


def _unfinished_answers(conversation: Conversation) -> QuerySet[Message]:
    """Answers still queued or generating; one whose record admission has not written yet
    (the moment between this post's commit and its admission) counts as unfinished too."""
    return conversation.messages.filter(role=Message.Role.ASSISTANT).filter(
        Q(generation__status=Generation.Status.PENDING) | Q(generation__pk__isnull=True)
    )


def request_cancel(*, message: Message) -> bool:
    """Ask the workers to stop this answer. False when it had already finished."""
    if message.generation.status != Generation.Status.PENDING:
        return False
    control.request_cancel(request_id=str(message.generation_id))
    return True


def message_feedback_set(*, message: Message, feedback: Message.Feedback) -> Message:
    """Record the asker's thumbs up or down on an answer; a second vote replaces the first. An
    answer rated down is never served from the result cache again."""
    if message.role != Message.Role.ASSISTANT or message.generation.status != Generation.Status.DONE:
        raise FeedbackRejected("Only a finished answer can be rated.")
    message.feedback = feedback
    message.save(update_fields=["feedback"])
    if feedback == Message.Feedback.DOWN:
        _cached_answer_forget(message)
    return message


def _cached_answer_forget(message: Message) -> None:
    """An answer rated down is never served from the result cache again: the entry it
    started, or, when it was served from the cache, the entry it was served from."""
    generation = message.generation
    if generation.cache in {CacheResult.MISS, ""}:
        answer_cache.answer_forget(request_id=str(generation.request_id))
        return
    question = (
        message.conversation.messages.filter(role=Message.Role.USER).order_by("created_at", "id").first()
    )
    variant = Variant.objects.filter(name=generation.variant).first()
    vector = _question_vector(question.content) if question is not None else None
    if variant is not None and vector is not None:
        answer_cache.answer_forget_served(variant=variant, question=question.content, vector=vector)


def guest_conversations_purge(*, older_than_days: int) -> int:
    """Delete guests' conversations idle for `older_than_days`, and the answers' texts with them:
    the generation records keep their timings and outcome for the console's figures, not what
    was said (answers often repeat what the guest told). A cached answer written for one of them
    is then never served again."""
    cutoff = timezone.now() - timedelta(days=older_than_days)
    expired = Conversation.objects.filter(owner__isnull=True, updated_at__lt=cutoff)
    with transaction.atomic():
        answered = Message.objects.filter(conversation__in=expired, generation_id__isnull=False)
        generations_text_forget(request_ids=answered.values("generation_id"))
        deleted, _ = expired.delete()
    return deleted


def sessions_expired_purge() -> int:
    """Delete expired sessions, as `manage.py clearsessions` does for the database backend."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return deleted
