"""Writes for the chat: every change to conversations and messages goes through here."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.crypto import constant_time_compare, salted_hmac

from chat.models import Conversation, Message, User
from knowledge import selectors as knowledge_selectors
from scheduler import control
from scheduler.admission import Admission, request_submit
from scheduler.routing import variant_for

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


def _help_center_prompt(text: str) -> tuple[str, int, list[dict[str, str]]]:
    """(system prompt, characters of excerpts in it, sources quoted) for the customer's message."""
    try:
        found = knowledge_selectors.help_center_excerpts(question=text)
    except knowledge_selectors.EmbedderUnavailable:
        logger.warning("Answering without the help center: its embedding model is not prepared")
        return settings.CHAT_SYSTEM_PROMPT, 0, []
    if not found.excerpts:
        return f"{settings.CHAT_SYSTEM_PROMPT}\n\n{NO_HELP_CENTER_MATCH_PROMPT}", 0, []
    excerpts = "\n\n".join(
        f"## {excerpt.source.title}{f' / {excerpt.heading}' if excerpt.heading else ''}\n{excerpt.text}"
        for excerpt in found.excerpts
    )
    prompt = f"{settings.CHAT_SYSTEM_PROMPT}\n\n{HELP_CENTER_PROMPT.format(excerpts=excerpts)}"
    excerpt_chars = sum(len(excerpt.text) for excerpt in found.excerpts)
    return prompt, excerpt_chars, [source.as_dict() for source in found.sources]


def _prompt_messages(
    conversation: Conversation, text: str
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The system prompt with the help center's excerpts on the message, as much recent history
    as fits the room the excerpts leave, then the new message: the prompt must leave room for
    the answer inside the model's context. Also returns the articles quoted."""
    system_prompt, excerpt_chars, sources = _help_center_prompt(text)
    recent = (
        conversation.messages.filter(status=Message.Status.DONE)
        .exclude(content="")
        .order_by("-created_at", "-id")
        .values("role", "content")[: settings.CHAT_HISTORY_MESSAGES]
    )
    history: list[dict[str, str]] = []
    budget = settings.CHAT_HISTORY_MAX_CHARS - excerpt_chars
    for message in recent:
        budget -= len(message["content"])
        if budget < 0:
            break
        history.append(message)
    history.reverse()
    messages = [{"role": "system", "content": system_prompt}, *history, {"role": "user", "content": text}]
    return messages, sources


def message_post(
    *,
    conversation: Conversation,
    text: str,
    tier: str,
    client_id: str,
    client_address: str | None = None,
) -> PostedMessage:
    """Persist the user's message and queue its answer; a new conversation (conversation_new)
    is saved with it.

    Raises MessageRejected, ConversationBusy, or scheduler.admission.AdmissionRefused; on any
    refusal nothing of this message stays behind, nor a conversation saved for it.
    """
    text = _validated_text(text)
    request_id = uuid.uuid4()
    variant = variant_for(conversation_id=str(conversation.pk))
    is_new = conversation._state.adding
    if is_new:
        _conversation_insert(conversation)
    with transaction.atomic():
        if conversation.messages.filter(status=Message.Status.PENDING).exists():
            raise ConversationBusy("Please wait for the current answer, or stop it, first.")
        messages, sources = _prompt_messages(conversation, text)
        payload = {
            "messages": messages,
            "max_tokens": settings.GENERATION_MAX_TOKENS,
            "temperature": settings.GENERATION_TEMPERATURE,
            "top_p": settings.GENERATION_TOP_P,
            "conversation_id": str(conversation.pk),
            "disconnect_grace_s": settings.STREAM_DISCONNECT_GRACE_S,
        }
        user_message = Message.objects.create(conversation=conversation, role=Message.Role.USER, content=text)
        assistant_message = Message.objects.create(
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            status=Message.Status.PENDING,
            request_id=request_id,
            variant=variant,
            sources=sources,
        )
        Conversation.objects.filter(pk=conversation.pk).update(updated_at=timezone.now())
    try:
        admission = request_submit(
            request_id=str(request_id),
            client_id=client_id,
            tier=tier,
            variant=variant,
            payload=payload,
            client_address=client_address,
        )
    except Exception:
        Message.objects.filter(pk__in=[user_message.pk, assistant_message.pk]).delete()
        if is_new:
            conversation.delete()
        raise
    return PostedMessage(user_message, assistant_message, admission)


def request_cancel(*, message: Message) -> bool:
    """Ask the workers to stop this answer. False when it had already finished."""
    if message.status != Message.Status.PENDING:
        return False
    control.request_cancel(request_id=str(message.request_id))
    return True


def assistant_message_finish(
    *,
    request_id: str,
    content: str,
    status: str,
    finish_reason: str = "",
    error_code: str = "",
    usage: dict[str, int] | None = None,
    timings: dict[str, float] | None = None,
) -> bool:
    """Store the final answer. Idempotent on request_id: a replayed finish changes nothing.

    Returns False when the message was already finished (or no longer exists).
    """
    usage = usage or {}
    timings = timings or {}
    updated = Message.objects.filter(request_id=request_id, status=Message.Status.PENDING).update(
        content=content,
        status=status,
        finish_reason=finish_reason,
        error_code=error_code,
        prompt_tokens=usage.get("prompt_tokens"),
        output_tokens=usage.get("completion_tokens"),
        engine=timings.get("engine", ""),
        ttft_ms=timings.get("ttft_ms"),
        duration_ms=timings.get("duration_ms"),
        completed_at=timezone.now(),
    )
    return updated == 1


def message_feedback_set(*, message: Message, feedback: Message.Feedback) -> Message:
    """Record the asker's thumbs up or down on an answer; a second vote replaces the first."""
    if message.role != Message.Role.ASSISTANT or message.status != Message.Status.DONE:
        raise FeedbackRejected("Only a finished answer can be rated.")
    message.feedback = feedback
    message.save(update_fields=["feedback"])
    return message


def guest_conversations_purge(*, older_than_days: int) -> int:
    cutoff = timezone.now() - timedelta(days=older_than_days)
    deleted, _ = Conversation.objects.filter(owner__isnull=True, updated_at__lt=cutoff).delete()
    return deleted


def sessions_expired_purge() -> int:
    """Delete expired sessions, as `manage.py clearsessions` does for the database backend."""
    deleted, _ = Session.objects.filter(expire_date__lt=timezone.now()).delete()
    return deleted
