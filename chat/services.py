"""Writes for the chat: every change to conversations and messages goes through here."""

from __future__ import annotations

import logging
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

from chat.models import Conversation, Message, User
from knowledge import cache as answer_cache
from knowledge import selectors as knowledge_selectors
from scheduler import control
from scheduler.admission import Admission, request_answer_cached, request_submit
from scheduler.generation import GenerationJob, Origin, Tier
from scheduler.models import CacheResult, Generation, Variant
from scheduler.routing import variant_for_conversation
from scheduler.services import generation_cache_note

logger = logging.getLogger(__name__)


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
    if len(text) > settings.CHAT_MAX_MESSAGE_CHARS:
        raise MessageRejected(
            f"Messages can be at most {settings.CHAT_MAX_MESSAGE_CHARS} characters "
            f"(this one has {len(text)})."
        )
    return text


# The help center decides what the assistant may say: a small model asked without it invents
# policies, and one told to keep to excerpts still needs to be told what to do without any.
HELP_CENTER_PROMPT = (
    "Answer only from these excerpts of our help center. If they do not answer the question, "
    "say that you do not know, and offer to put the customer in touch with a person from our "
    "team or ask what exactly they need. Never make up policies, prices or dates.\n\n{excerpts}"
)
NO_HELP_CENTER_MATCH_PROMPT = (
    "Our help center has nothing on this message. If it is a greeting or thanks, reply briefly. "
    "Otherwise say that you do not know, and offer to put the customer in touch with a person "
    "from our team or ask what exactly they need. Never make up policies, prices or dates."
)


@dataclass(frozen=True, slots=True)
class _HelpCenterPrompt:
    system_prompt: str
    excerpt_chars: int
    sources: list[dict[str, str]]
    kb_version: int | None  # the knowledge base searched; None: not searched


def _help_center_prompt(variant: Variant, text: str, vector: np.ndarray | None) -> _HelpCenterPrompt:
    """The system prompt for the customer's message in the variant's words, with the help
    center's excerpts; a variant with the help center off gets its own prompt alone."""
    if not variant.knowledge or vector is None:
        return _HelpCenterPrompt(variant.system_prompt, 0, [], None)
    found = knowledge_selectors.help_center_excerpts(question=text, vector=vector)
    if not found.excerpts:
        no_match = f"{variant.system_prompt}\n\n{NO_HELP_CENTER_MATCH_PROMPT}"
        return _HelpCenterPrompt(no_match, 0, [], found.version)
    excerpts = "\n\n".join(
        f"## {excerpt.source.title}{f' / {excerpt.heading}' if excerpt.heading else ''}\n{excerpt.text}"
        for excerpt in found.excerpts
    )
    return _HelpCenterPrompt(
        system_prompt=f"{variant.system_prompt}\n\n{HELP_CENTER_PROMPT.format(excerpts=excerpts)}",
        excerpt_chars=sum(len(excerpt.text) for excerpt in found.excerpts),
        sources=[source.as_dict() for source in found.sources],
        kb_version=found.version,
    )


def _question_vector(text: str) -> np.ndarray | None:
    try:
        return knowledge_selectors.question_vector(text)
    except knowledge_selectors.EmbedderUnavailable:
        logger.warning("Answering without the help center: its embedding model is not prepared")
        return None


def _prompt_messages(
    conversation: Conversation, text: str, help_center: _HelpCenterPrompt
) -> list[dict[str, str]]:
    """The system prompt with the help center's excerpts on the message, as much recent history
    as fits the room the excerpts leave, then the new message: the prompt must leave room for
    the answer inside the model's context."""
    system_prompt, excerpt_chars = help_center.system_prompt, help_center.excerpt_chars
    recent = (
        conversation.messages.filter(Q(role=Message.Role.USER) | Q(generation__status=Generation.Status.DONE))
        .annotate(text=Coalesce("generation__text", "content"))
        .exclude(text="")
        .order_by("-created_at", "-id")
        .values("role", "text")[: settings.CHAT_HISTORY_MESSAGES]
    )
    history: list[dict[str, str]] = []
    budget = settings.CHAT_HISTORY_MAX_CHARS - excerpt_chars
    for message in recent:
        budget -= len(message["text"])
        if budget < 0:
            break
        history.append({"role": message["role"], "content": message["text"]})
    history.reverse()
    return [{"role": "system", "content": system_prompt}, *history, {"role": "user", "content": text}]


def message_post(
    *,
    conversation: Conversation,
    text: str,
    tier: Tier,
    client_id: str,
    client_address: str | None = None,
) -> PostedMessage:
    """Persist the user's message and queue its answer; a new conversation (conversation_new)
    is saved with it.

    A first message may be answered from the result cache (knowledge.cache) instead: the same
    record, messages and stream, with no queue and no worker.

    Raises MessageRejected, ConversationBusy, or scheduler.admission.AdmissionRefused; on any
    refusal nothing of this message stays behind, nor a conversation saved for it.
    """
    text = _validated_text(text)
    request_id = uuid.uuid4()
    variant = variant_for_conversation(conversation_id=str(conversation.pk))
    is_new = conversation._state.adding
    first_turn = is_new or not conversation.messages.exists()
    vector = _question_vector(text) if variant.knowledge or settings.ANSWER_CACHE_ENABLED else None
    cacheable = (
        settings.ANSWER_CACHE_ENABLED
        and first_turn
        and vector is not None
        and not answer_cache.personal_data_found(text, names=answer_cache.account_names(conversation.owner))
    )
    context = answer_cache.chat_context(variant) if cacheable else ""
    if is_new:
        _conversation_insert(conversation)
    with transaction.atomic():
        # One answer at a time: concurrent posts to a conversation take its row lock in turn, so
        # each one's check sees the pending answer of the post before it. (SQLite has no row
        # locks and ignores this; its immediate transactions take the database's write lock.)
        Conversation.objects.select_for_update(no_key=True).filter(pk=conversation.pk).exists()
        if _unfinished_answers(conversation).exists():
            raise ConversationBusy("Please wait for the current answer, or stop it, first.")
        lookup = None
        if cacheable:
            lookup = answer_cache.answer_lookup(
                variant=variant.name, context=context, question=text, vector=vector
            )
        if lookup is not None and lookup.answer is not None:
            help_center, messages, sources = None, [{"role": "user", "content": text}], lookup.sources
        else:
            help_center = _help_center_prompt(variant, text, vector)
            messages, sources = _prompt_messages(conversation, text, help_center), help_center.sources
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
        )
        user_message = Message.objects.create(conversation=conversation, role=Message.Role.USER, content=text)
        assistant_message = Message.objects.create(
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            generation_id=request_id,
            sources=sources,
        )
        Conversation.objects.filter(pk=conversation.pk).update(updated_at=timezone.now())
    try:
        if lookup is not None and lookup.answer is not None:
            admission = request_answer_cached(job=job, answer=lookup.answer, client_address=client_address)
        else:
            admission = request_submit(job=job, client_address=client_address)
    except Exception:
        Message.objects.filter(pk__in=[user_message.pk, assistant_message.pk]).delete()
        if is_new:
            conversation.delete()
        raise
    if lookup is not None and lookup.answer is None and help_center is not None:
        generation_cache_note(request_id=job.request_id, result=CacheResult.MISS, lookup_ms=lookup.lookup_ms)
        kb_version = help_center.kb_version
        answer_cache.answer_remember(
            variant=variant.name,
            context=context,
            question=text,
            vector=vector,
            kb_version=knowledge_selectors.knowledge_base_version() if kb_version is None else kb_version,
            source_slugs=[source["slug"] for source in sources],
            request_id=job.request_id,
        )
    return PostedMessage(user_message, assistant_message, admission)


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
    cutoff = timezone.now() - timedelta(days=older_than_days)
    deleted, _ = Conversation.objects.filter(owner__isnull=True, updated_at__lt=cutoff).delete()
    return deleted


def sessions_expired_purge() -> int:
    """Delete expired sessions, as `manage.py clearsessions` does for the database backend."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return deleted
