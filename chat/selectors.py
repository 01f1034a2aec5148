"""Reads for the chat: what a client (account or guest session) may see. Agents' private notes
are not among them (chat.handoff_selectors reads those, for the team only)."""

from dataclasses import dataclass
from uuid import UUID

from django.db.models import BooleanField, ExpressionWrapper, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Left

from accounts.models import User
from chat.handoff import DEFAULT_AGENT_NAME
from chat.handoff_events import stream_last_id
from chat.models import AgentProfile, Conversation, Handoff, Message


def _owned_by(user: User | None, session_key: str | None, via: str = "") -> Q:
    """Rows of this client's conversations; `via` reaches the conversation from another model
    (a join, so a lookup by a unique key stays one index probe however many it owns)."""
    if user is not None and user.is_authenticated:
        return Q(**{f"{via}owner": user})
    if session_key:
        return Q(**{f"{via}owner__isnull": True, f"{via}session_key": session_key})
    return Q(pk__in=[])


def conversation_find(
    *, conversation_id: UUID, user: User | None, session_key: str | None
) -> Conversation | None:
    """The client's conversation, or None when nobody has stored one with this id (one query).
    Raises Conversation.DoesNotExist when it is another client's."""
    conversation = (
        Conversation.objects.filter(pk=conversation_id)
        .annotate(owned=ExpressionWrapper(_owned_by(user, session_key), output_field=BooleanField()))
        .first()
    )
    if conversation is not None and not conversation.owned:
        raise Conversation.DoesNotExist(f"Conversation {conversation_id} is another client's.")
    return conversation


def conversation_latest(*, user: User | None, session_key: str | None) -> Conversation | None:
    return Conversation.objects.filter(_owned_by(user, session_key)).first()


# The sidebar shortens a title further; reading only this much keeps a list of long questions light.
_TITLE_SOURCE_CHARS = 100


def conversation_list(
    *, user: User | None, session_key: str | None, limit: int = 20
) -> QuerySet[Conversation]:
    """The client's recent conversations, each with `title`: the start of its first question
    (None while nothing has been asked)."""
    first_question = (
        Message.objects.filter(conversation=OuterRef("pk"), role=Message.Role.USER)
        .order_by("created_at", "id")
        .values(head=Left("content", _TITLE_SOURCE_CHARS))[:1]
    )
    owned = Conversation.objects.filter(_owned_by(user, session_key))
    return owned.annotate(title=Subquery(first_question))[:limit]


def conversation_messages(*, conversation: Conversation) -> QuerySet[Message]:
    if conversation._state.adding:  # a new conversation, saved with its first message
        return Message.objects.none()
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


# --- the hand-off, as the customer sees it (never an agent's private note) ------------------------


@dataclass(frozen=True, slots=True)
class HandoffView:
    state: str  # Conversation.HandoffState
    agent: str | None  # the display name of the person answering, or who resolved it
    rate_handoff: int | None  # the resolved hand-off the customer has not rated yet
    events_after: str  # the event stream's last id before this was read: follow from there


def _agent_name(user_id: int | None) -> str | None:
    if user_id is None:
        return None
    name = AgentProfile.objects.filter(user_id=user_id).values_list("display_name", flat=True).first()
    return name or DEFAULT_AGENT_NAME


def handoff_view(*, conversation: Conversation) -> HandoffView:
    events_after = stream_last_id(str(conversation.pk)) if not conversation._state.adding else "0-0"
    if conversation._state.adding:
        return HandoffView(Conversation.HandoffState.ASSISTANT, None, None, events_after)
    state = Conversation.objects.filter(pk=conversation.pk).values_list("handoff_state", "assignee_id").get()
    latest = conversation.handoffs.order_by("-requested_at", "-id").first()
    rate = None
    if latest is not None and latest.outcome == Handoff.Outcome.RESOLVED and latest.rating is None:
        rate = latest.pk
    agent_id = state[1] if state[1] is not None else (latest.agent_id if latest is not None else None)
    return HandoffView(state[0], _agent_name(agent_id), rate, events_after)


def handoff_messages(*, conversation: Conversation, after_message_id: int) -> QuerySet[Message]:
    """The customer's and agents' messages after the one the page shows last (what it missed
    while its stream was away)."""
    return conversation.messages.filter(
        pk__gt=after_message_id, role__in=[Message.Role.USER, Message.Role.AGENT]
    ).order_by("created_at", "id")
