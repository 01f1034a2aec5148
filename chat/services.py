"""Writes for the chat: every change to conversations and messages goes through here."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from chat.models import Conversation, Message, User
from scheduler import control
from scheduler.admission import Admission, request_submit
from scheduler.routing import variant_for


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


def conversation_create(*, owner: User | None, session_key: str) -> Conversation:
    if owner is not None and owner.is_authenticated:
        return Conversation.objects.create(owner=owner)
    return Conversation.objects.create(session_key=session_key)


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


def _prompt_messages(conversation: Conversation, text: str) -> list[dict[str, str]]:
    """The system prompt, as much recent history as fits the budget, then the new message:
    the prompt must leave room for the answer inside the model's context."""
    recent = (
        conversation.messages.filter(status=Message.Status.DONE)
        .exclude(content="")
        .order_by("-created_at", "-id")
        .values("role", "content")[: settings.CHAT_HISTORY_MESSAGES]
    )
    history: list[dict[str, str]] = []
    budget = settings.CHAT_HISTORY_MAX_CHARS
    for message in recent:
        budget -= len(message["content"])
        if budget < 0:
            break
        history.append(message)
    history.reverse()
    return [
        {"role": "system", "content": settings.CHAT_SYSTEM_PROMPT},
        *history,
        {"role": "user", "content": text},
    ]


def message_post(
    *,
    conversation: Conversation,
    text: str,
    tier: str,
    client_id: str,
    client_address: str | None = None,
) -> PostedMessage:
    """Persist the user's message and queue its answer.

    Raises MessageRejected, ConversationBusy, or scheduler.admission.AdmissionRefused; on any
    refusal nothing of this message stays behind.
    """
    text = _validated_text(text)
    request_id = uuid.uuid4()
    variant = variant_for(conversation_id=str(conversation.pk))
    with transaction.atomic():
        # One answer at a time: concurrent posts to a conversation take its row lock in turn, so
        # each one's check sees the pending answer of the post before it. (SQLite has no row
        # locks and ignores this; its immediate transactions take the database's write lock.)
        Conversation.objects.select_for_update(no_key=True).filter(pk=conversation.pk).exists()
        if conversation.messages.filter(status=Message.Status.PENDING).exists():
            raise ConversationBusy("Please wait for the current answer, or stop it, first.")
        payload = {
            "messages": _prompt_messages(conversation, text),
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
