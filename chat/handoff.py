"""The hand-off to a person: every change to who answers a conversation goes through here.

A conversation's `handoff_state` is the record, changed only by the transitions below, each a
conditional UPDATE from the states it may leave (so two agents claiming at once, or a claim and
the customer giving up, cannot both win):

    request    assistant, resolved -> waiting    the customer asks for a person
    withdraw   waiting -> assistant              the customer stops waiting
    claim      waiting -> agent                  an agent takes it (one wins; the other: 409)
    hand_back  agent -> assistant                the agent gives it back to the assistant
    resolve    agent -> resolved                 the agent is done; the customer is asked to rate
    reopen     resolved -> assistant             the customer writes again: the assistant answers

Messages while waiting or with an agent are stored for the agent and get no answer; agents
reply and leave private notes; a resolved hand-off is rated once. Each write commits first, and
its live events (chat.handoff_events) go out once it has. Agents' actions are audited by
admin_console.services.handoff, which calls the agent's functions here inside its own transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import User
from chat import handoff_events as events
from chat.models import AgentNote, AgentProfile, Conversation, Handoff, Message
from chat.person_request import asks_for_person
from chat.presence import agents_online
from scheduler.generation import Tier

State = Conversation.HandoffState


class HandoffConflict(RuntimeError):
    """Not possible in the conversation's state now (409); the message says why."""


class HandoffRejected(ValueError):
    """What was sent cannot be taken as it is (400): empty or too long text, a rating off the scale."""


class NotAnAgent(PermissionError):
    """Only accounts with the agent permission answer customers."""


AGENT_PERMISSION = "chat.agent"
# What customers see for an agent who has not set a display name: never the account's name.
DEFAULT_AGENT_NAME = "Support team"
MAX_RATING_COMMENT_CHARS = 1000


class Action(StrEnum):
    REQUEST = "request"
    WITHDRAW = "withdraw"
    CLAIM = "claim"
    HAND_BACK = "hand_back"
    RESOLVE = "resolve"
    REOPEN = "reopen"


# Each transition: the states it leaves from, and the state it leads to.
TRANSITIONS: dict[Action, tuple[frozenset[str], str]] = {
    Action.REQUEST: (frozenset({State.ASSISTANT, State.RESOLVED}), State.WAITING),
    Action.WITHDRAW: (frozenset({State.WAITING}), State.ASSISTANT),
    Action.CLAIM: (frozenset({State.WAITING}), State.AGENT),
    Action.HAND_BACK: (frozenset({State.AGENT}), State.ASSISTANT),
    Action.RESOLVE: (frozenset({State.AGENT}), State.RESOLVED),
    Action.REOPEN: (frozenset({State.RESOLVED}), State.ASSISTANT),
}
# Where a customer's message goes: stored for a person in these states, answered otherwise.
WITH_A_PERSON = frozenset({State.WAITING, State.AGENT})

_CONFLICTS = {
    (Action.REQUEST, State.WAITING): "A person has been asked for already: please wait for them.",
    (Action.REQUEST, State.AGENT): "A person from our team is answering this conversation already.",
    (Action.WITHDRAW, State.AGENT): "A person from our team has joined this conversation.",
    (Action.CLAIM, State.AGENT): "Another agent is answering this conversation already.",
    (Action.CLAIM, State.ASSISTANT): "The customer went back to the assistant: nobody is waiting any more.",
    (Action.CLAIM, State.RESOLVED): "This conversation was resolved.",
}


def _conflict(action: Action, state: str) -> HandoffConflict:
    label = Conversation.HandoffState(state).label.lower()
    return HandoffConflict(_CONFLICTS.get((action, state), f"Not possible now: the conversation is {label}."))


def _move(conversation_id: UUID, action: Action, **fields: object) -> None:
    """The transition `action`, if the conversation is in a state it leaves from; raises
    HandoffConflict (naming the state it is in) otherwise. Inside the caller's transaction."""
    sources, target = TRANSITIONS[action]
    moved = Conversation.objects.filter(pk=conversation_id, handoff_state__in=sources).update(
        handoff_state=target, updated_at=timezone.now(), **fields
    )
    if not moved:
        state = (
            Conversation.objects.filter(pk=conversation_id).values_list("handoff_state", flat=True).first()
        )
        if state is None:
            raise Conversation.DoesNotExist(f"No conversation {conversation_id}.")
        raise _conflict(action, state)


def _publish(
    conversation_id: UUID, bodies: list[events.ConversationEventBody], *, inbox: bool = True
) -> None:
    transaction.on_commit(lambda: events.events_publish(str(conversation_id), bodies, inbox=inbox))


def _open_handoff(conversation_id: UUID) -> Handoff:
    return Handoff.objects.select_for_update().get(conversation_id=conversation_id, ended_at__isnull=True)


def _message_event(message: Message) -> events.MessageSent:
    return events.MessageSent(
        id=message.pk,
        role=message.role,
        text=message.content,
        author=message.author_name or None,
        at=events.iso(message.created_at),
    )


# --- the customer -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeldMessage:
    """A customer's message kept for a person instead of answered: `agents_online` is told when
    it asked for one (none: the page offers to leave the question)."""

    user_message: Message
    handoff_state: str
    agents_online: int | None = None


@dataclass(frozen=True, slots=True)
class HandoffRequested:
    handoff: Handoff
    agents_online: int
    message: Message | None  # the message that asked in words


def handoff_request(
    *, conversation: Conversation, trigger: Handoff.Trigger, tier: str, text: str = ""
) -> HandoffRequested:
    """The customer asks for a person: the conversation waits for one (VIP customers first). A
    new conversation (chat.services.conversation_new) is stored with it; `text`, the message
    that asked in words, is stored with it too. Raises HandoffConflict while a person has been
    asked for already."""
    online = len(agents_online())
    with transaction.atomic():
        if conversation._state.adding:
            try:
                with transaction.atomic():
                    conversation.save(force_insert=True)
            except IntegrityError as exc:  # the same new conversation, asked for twice at once
                raise HandoffConflict("A person has been asked for already: please wait for them.") from exc
        bodies: list[events.ConversationEventBody] = []
        message = None
        if text:
            message = Message.objects.create(conversation=conversation, role=Message.Role.USER, content=text)
            bodies.append(_message_event(message))
        _move(conversation.pk, Action.REQUEST, assignee=None)
        handoff = Handoff.objects.create(
            conversation=conversation, trigger=trigger, vip=tier == Tier.VIP, agents_online=online
        )
        bodies.append(events.Requested(trigger=str(trigger), agents_online=online))
        _publish(conversation.pk, bodies)
    conversation.handoff_state = State.WAITING
    return HandoffRequested(handoff, online, message)


def handoff_withdraw(*, conversation: Conversation) -> None:
    """The customer stops waiting: back to the assistant. Raises HandoffConflict once an agent
    has joined (the page shows them)."""
    with transaction.atomic():
        _move(conversation.pk, Action.WITHDRAW)
        Handoff.objects.filter(conversation=conversation, ended_at__isnull=True).update(
            ended_at=timezone.now(), outcome=Handoff.Outcome.WITHDRAWN
        )
        _publish(conversation.pk, [events.HandedBack(by="customer")])
    conversation.handoff_state = State.ASSISTANT


def message_for_person(*, conversation: Conversation, text: str, tier: str) -> HeldMessage | None:
    """Where a customer's (checked) message goes: kept for a person when the conversation is
    with one or the message asks for one, in which case a person is asked for; None when the
    assistant answers it (a resolved conversation is reopened to the assistant first)."""
    state = conversation.handoff_state
    if state in WITH_A_PERSON:
        message = customer_message_hold(conversation=conversation, text=text)
        return HeldMessage(message, conversation.handoff_state)
    if asks_for_person(text):
        requested = handoff_request(
            conversation=conversation, trigger=Handoff.Trigger.WORDS, tier=tier, text=text
        )
        assert requested.message is not None
        return HeldMessage(requested.message, State.WAITING, requested.agents_online)
    if state == State.RESOLVED:
        conversation_reopen(conversation=conversation)
    return None


def customer_message_hold(*, conversation: Conversation, text: str) -> Message:
    """Store the customer's message for the person who has it or will have it; no answer is
    queued. Raises HandoffConflict when it went back to the assistant meanwhile."""
    with transaction.atomic():
        state = (
            Conversation.objects.select_for_update()
            .filter(pk=conversation.pk)
            .values_list("handoff_state", flat=True)
            .get()
        )
        if state not in WITH_A_PERSON:
            raise HandoffConflict("This conversation is back with the assistant: send your message again.")
        message = Message.objects.create(conversation=conversation, role=Message.Role.USER, content=text)
        Conversation.objects.filter(pk=conversation.pk).update(updated_at=timezone.now())
        _publish(conversation.pk, [_message_event(message)])
    conversation.handoff_state = state
    return message


def conversation_reopen(*, conversation: Conversation) -> None:
    """A resolved conversation the customer writes to again goes back to the assistant (the
    resolved hand-off keeps its rating); they may ask for a person again."""
    with transaction.atomic():
        try:
            _move(conversation.pk, Action.REOPEN, assignee=None)
        except HandoffConflict:
            return  # someone moved it meanwhile: the message goes where the state says
    conversation.handoff_state = State.ASSISTANT


def typing_publish(*, conversation: Conversation, who: str, author: str | None = None) -> None:
    """Someone is typing in a conversation with a person (no record: only the live pages)."""
    events.events_publish(str(conversation.pk), [events.Typing(who=who, author=author)], inbox=False)


def handoff_rate(*, conversation: Conversation, rating: int, comment: str = "") -> Handoff:
    """The customer's rating (1-5, and a comment) of the latest resolved hand-off, once.
    Raises HandoffRejected for a rating off the scale or a long comment, HandoffConflict when
    there is none to rate or it was rated already."""
    comment = comment.strip()
    if rating not in range(1, 6):
        raise HandoffRejected("Choose a rating from 1 to 5.")
    if len(comment) > MAX_RATING_COMMENT_CHARS:
        raise HandoffRejected(f"A comment can be at most {MAX_RATING_COMMENT_CHARS} characters.")
    latest = (
        conversation.handoffs.filter(outcome=Handoff.Outcome.RESOLVED).order_by("-ended_at", "-id").first()
    )
    if latest is None:
        raise HandoffConflict("There is no conversation with a person to rate here.")
    rated = Handoff.objects.filter(pk=latest.pk, rating__isnull=True).update(
        rating=rating, rating_comment=comment, rated_at=timezone.now()
    )
    if not rated:
        raise HandoffConflict("You have rated this conversation already. Thank you!")
    _publish(conversation.pk, [])  # the inbox shows the rating
    latest.refresh_from_db()
    return latest


# --- the agent ----------------------------------------------------------------------------------


def agent_check(agent: User) -> None:
    if not (agent.is_active and agent.has_perm(AGENT_PERMISSION)):
        raise NotAnAgent("Only agents answer customers.")


def agent_profile(agent: User) -> AgentProfile:
    profile, _ = AgentProfile.objects.get_or_create(user=agent)
    return profile


def agent_display_name(agent: User) -> str:
    return agent_profile(agent).display_name or DEFAULT_AGENT_NAME


def agent_text_validated(text: str) -> str:
    text = text.strip()
    if not text:
        raise HandoffRejected("Type a message first.")
    if "\x00" in text:
        raise HandoffRejected("Messages cannot contain NUL characters.")
    if len(text) > settings.CHAT_MAX_MESSAGE_CHARS:
        limit = settings.CHAT_MAX_MESSAGE_CHARS
        raise HandoffRejected(f"Messages can be at most {limit} characters (this one has {len(text)}).")
    return text


def _assigned_locked(conversation_id: UUID, agent: User) -> Conversation:
    """The conversation, locked, when `agent` is answering it; else HandoffConflict."""
    conversation = Conversation.objects.select_for_update().get(pk=conversation_id)
    if conversation.handoff_state != State.AGENT:
        raise _conflict(Action.RESOLVE, conversation.handoff_state)
    if conversation.assignee_id != agent.pk:
        raise HandoffConflict("Another agent is answering this conversation: claim a waiting one instead.")
    return conversation


def conversation_claim(*, conversation_id: UUID, agent: User) -> Conversation:
    """The agent takes a waiting conversation: one of two agents claiming at once wins, the
    other gets HandoffConflict; so does an agent at their capacity."""
    agent_check(agent)
    profile = agent_profile(agent)
    name = profile.display_name or DEFAULT_AGENT_NAME
    with transaction.atomic():
        # An agent's claims one at a time, so two of theirs cannot both pass the capacity check.
        AgentProfile.objects.select_for_update().filter(pk=profile.pk).exists()
        load = Conversation.objects.filter(assignee=agent, handoff_state=State.AGENT).count()
        if load >= profile.capacity:
            raise HandoffConflict(
                f"You are answering {load} conversations, your capacity: resolve or hand one back first."
            )
        _move(conversation_id, Action.CLAIM, assignee=agent)
        Handoff.objects.filter(conversation_id=conversation_id, ended_at__isnull=True).update(
            agent=agent, claimed_at=timezone.now()
        )
        _publish(conversation_id, [events.AgentJoined(agent=name)])
    return Conversation.objects.get(pk=conversation_id)


def agent_reply(*, conversation_id: UUID, agent: User, text: str) -> Message:
    """The agent's message to the customer, stored before it is shown, under their display
    name. Raises HandoffRejected (empty, too long) or HandoffConflict (not theirs to answer)."""
    agent_check(agent)
    text = agent_text_validated(text)
    name = agent_display_name(agent)
    with transaction.atomic():
        _assigned_locked(conversation_id, agent)
        message = Message.objects.create(
            conversation_id=conversation_id,
            role=Message.Role.AGENT,
            content=text,
            author=agent,
            author_name=name,
        )
        Handoff.objects.filter(
            conversation_id=conversation_id, ended_at__isnull=True, first_reply_at__isnull=True
        ).update(first_reply_at=message.created_at)
        Conversation.objects.filter(pk=conversation_id).update(updated_at=timezone.now())
        _publish(conversation_id, [_message_event(message)])
    return message


def agent_note(*, conversation_id: UUID, agent: User, text: str) -> AgentNote:
    """A private note on the conversation for the team: never on the customer's page or stream."""
    agent_check(agent)
    text = agent_text_validated(text)
    with transaction.atomic():
        conversation = Conversation.objects.get(pk=conversation_id)
        note = AgentNote.objects.create(
            conversation=conversation, author=agent, author_name=agent_display_name(agent), text=text
        )
        # Other agents' inboxes look again; the conversation's own stream (the customer's) never hears of it.
        _publish(conversation_id, [])
    return note


def handoff_hand_back(*, conversation_id: UUID, agent: User) -> None:
    """The agent gives the conversation back to the assistant, which answers what comes next."""
    agent_check(agent)
    with transaction.atomic():
        _assigned_locked(conversation_id, agent)
        _move(conversation_id, Action.HAND_BACK, assignee=None)
        Handoff.objects.filter(conversation_id=conversation_id, ended_at__isnull=True).update(
            ended_at=timezone.now(), outcome=Handoff.Outcome.HANDED_BACK
        )
        _publish(conversation_id, [events.HandedBack(by="agent")])


def handoff_resolve(*, conversation_id: UUID, agent: User) -> Handoff:
    """The agent is done: the conversation is resolved and the customer asked for a rating, once."""
    agent_check(agent)
    with transaction.atomic():
        _assigned_locked(conversation_id, agent)
        _move(conversation_id, Action.RESOLVE, assignee=None)
        handoff = _open_handoff(conversation_id)
        handoff.ended_at = timezone.now()
        handoff.outcome = Handoff.Outcome.RESOLVED
        handoff.save(update_fields=["ended_at", "outcome"])
        _publish(
            conversation_id,
            [events.Resolved(agent=agent_display_name(agent)), events.RatingRequest(handoff=handoff.pk)],
        )
    return handoff
