"""Reads for the chat: what a client (account or guest session) may see."""

from uuid import UUID

from django.db.models import Q, QuerySet

from chat.models import Conversation, Message, User


def _owned_by(user: User | None, session_key: str | None, via: str = "") -> Q:
    """Rows of this client's conversations; `via` reaches the conversation from another model
    (a join, so a lookup by a unique key stays one index probe however many it owns)."""
    if user is not None and user.is_authenticated:
        return Q(**{f"{via}owner": user})
    if session_key:
        return Q(**{f"{via}owner__isnull": True, f"{via}session_key": session_key})
    return Q(pk__in=[])


def conversation_get(*, conversation_id: UUID, user: User | None, session_key: str | None) -> Conversation:
    """Raises Conversation.DoesNotExist for unknown ids and for other clients' conversations."""
    return Conversation.objects.get(_owned_by(user, session_key), pk=conversation_id)


def conversation_latest(*, user: User | None, session_key: str | None) -> Conversation | None:
    return Conversation.objects.filter(_owned_by(user, session_key)).first()


def conversation_list(
    *, user: User | None, session_key: str | None, limit: int = 20
) -> QuerySet[Conversation]:
    return Conversation.objects.filter(_owned_by(user, session_key))[:limit]


def conversation_messages(*, conversation: Conversation) -> QuerySet[Message]:
    return conversation.messages.select_related("generation")


def assistant_message_get(*, request_id: UUID, user: User | None, session_key: str | None) -> Message:
    """Raises Message.DoesNotExist for unknown request ids and for other clients' requests."""
    owned = _owned_by(user, session_key, via="conversation__")
    return Message.objects.select_related("generation").get(
        owned, generation_id=request_id, role=Message.Role.ASSISTANT
    )


def assistant_message_owned(*, message_id: int, user: User | None, session_key: str | None) -> Message:
    """Raises Message.DoesNotExist for unknown ids and for other clients' answers."""
    owned = _owned_by(user, session_key, via="conversation__")
    return Message.objects.select_related("generation").get(owned, pk=message_id, role=Message.Role.ASSISTANT)
