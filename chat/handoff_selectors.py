"""Reads of the hand-off: the waiting list (and a waiting customer's place in it), agents'
inboxes and a conversation's full transcript for the team.

Agent-facing: these read private notes and other customers' conversations, and are only for
the console (admin_console checks the agent permission). What a customer may read is in
chat.selectors, which never reads a note.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Left
from django.utils import timezone

from accounts.models import User
from chat import handoff_events
from chat.handoff import DEFAULT_AGENT_NAME, State
from chat.models import AgentNote, AgentProfile, Conversation, Handoff, HandoffSettings, Message
from chat.presence import agents_online
from scheduler.models import Generation

# The waiting customer's expected wait is their place over the rate agents claimed at lately.
CLAIM_RATE_WINDOW_S = 30 * 60
CLAIM_RATE_MIN_CLAIMS = 3
_TITLE_CHARS = 80
EARLIER_CONVERSATIONS = 5
EARLIER_MESSAGES = 20


# --- the waiting list -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WaitingSnapshot:
    """Every waiting conversation's place (1 first: VIP customers, then the longest waiting),
    and what its wait is expected from."""

    positions: dict[str, int]
    claims_per_s: float | None  # None: too few claims lately to tell
    agents_online: int

    def status(self, conversation_id: str) -> dict[str, Any] | None:
        """The customer's `waiting` event, or None when the conversation is not waiting."""
        position = self.positions.get(conversation_id)
        if position is None:
            return None
        eta_s = None
        if self.agents_online and self.claims_per_s:
            eta_s = round(position / self.claims_per_s, 1)
        return {"position": position, "eta_s": eta_s, "agents_online": self.agents_online}


def waiting_snapshot(*, now: datetime | None = None) -> WaitingSnapshot:
    now = now or timezone.now()
    queue = Handoff.objects.filter(ended_at__isnull=True, claimed_at__isnull=True).order_by(
        "-vip", "requested_at", "id"
    )
    ids = [str(conversation_id) for conversation_id in queue.values_list("conversation_id", flat=True)]
    claims = Handoff.objects.filter(claimed_at__gte=now - timedelta(seconds=CLAIM_RATE_WINDOW_S)).count()
    return WaitingSnapshot(
        positions={conversation_id: n for n, conversation_id in enumerate(ids, start=1)},
        claims_per_s=claims / CLAIM_RATE_WINDOW_S if claims >= CLAIM_RATE_MIN_CLAIMS else None,
        agents_online=len(agents_online()),
    )


def offers(*, waiting: list[str], agents: dict[int, tuple[int, int]]) -> dict[str, int]:
    """Who each waiting conversation is offered to: in the waiting list's order, the online agent
    with the fewest conversations (then the lowest id) who has room. `agents`: agent id ->
    (conversations they answer, capacity), for online agents only. Conversations beyond the
    room left are offered to nobody yet."""
    load = dict(agents)
    offered: dict[str, int] = {}
    for conversation_id in waiting:
        free = [(n, agent_id) for agent_id, (n, capacity) in load.items() if n < capacity]
        if not free:
            break
        _, agent_id = min(free)
        offered[conversation_id] = agent_id
        n, capacity = load[agent_id]
        load[agent_id] = (n + 1, capacity)
    return offered


# --- the inbox ----------------------------------------------------------------------------------


def customer_label(conversation: Conversation) -> str:
    """How the team names a customer: their account, or a guest by a short fingerprint."""
    if conversation.owner_id is not None:
        return conversation.owner.get_username()
    return "Guest " + hashlib.sha256(conversation.session_key.encode()).hexdigest()[:6]


def _first_question() -> Subquery:
    return Subquery(
        Message.objects.filter(conversation=OuterRef("conversation_id"), role=Message.Role.USER)
        .order_by("created_at", "id")
        .values(head=Left("content", _TITLE_CHARS))[:1]
    )


def _last_message(field: str) -> Subquery:
    return Subquery(
        Message.objects.filter(conversation=OuterRef("conversation_id"))
        .exclude(role=Message.Role.ASSISTANT)
        .order_by("-created_at", "-id")
        .values(field)[:1]
    )


def _handoff_rows(handoffs: Any) -> list[Handoff]:
    return list(
        handoffs.select_related("conversation", "conversation__owner").annotate(
            title=_first_question(),
            last_text=Left(_last_message("content"), _TITLE_CHARS),
            last_role=_last_message("role"),
        )
    )


def _display_names(user_ids: set[int]) -> dict[int, str]:
    names = dict(AgentProfile.objects.filter(user_id__in=user_ids).values_list("user_id", "display_name"))
    return {user_id: names.get(user_id) or DEFAULT_AGENT_NAME for user_id in user_ids}


def inbox_snapshot(*, agent: User, now: datetime | None = None) -> dict[str, Any]:
    """What the agent's inbox shows, as data the page renders: waiting conversations (VIP
    first, then the longest waiting; each offered to the least loaded online agent with room),
    the agent's own, and those resolved today; who is online; the first-response target."""
    now = now or timezone.now()
    online = agents_online()
    answering = dict(
        Conversation.objects.filter(handoff_state=State.AGENT, assignee__isnull=False)
        .values_list("assignee_id")
        .annotate(n=Count("pk"))
    )
    capacities = dict(
        AgentProfile.objects.filter(user_id__in=online | {agent.pk}).values_list("user_id", "capacity")
    )
    default_capacity = AgentProfile._meta.get_field("capacity").default
    names = _display_names(online | {agent.pk})
    waiting = _handoff_rows(
        Handoff.objects.filter(ended_at__isnull=True, claimed_at__isnull=True).order_by(
            "-vip", "requested_at", "id"
        )
    )
    offered = offers(
        waiting=[str(h.conversation_id) for h in waiting],
        agents={
            agent_id: (answering.get(agent_id, 0), capacities.get(agent_id, default_capacity))
            for agent_id in online
        },
    )
    mine = _handoff_rows(
        Handoff.objects.filter(
            ended_at__isnull=True, agent=agent, conversation__handoff_state=State.AGENT
        ).order_by("claimed_at")
    )
    today = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
    resolved = _handoff_rows(
        Handoff.objects.filter(outcome=Handoff.Outcome.RESOLVED, ended_at__gte=today).order_by("-ended_at")
    )

    def row(handoff: Handoff) -> dict[str, Any]:
        conversation = handoff.conversation
        return {
            "id": str(conversation.pk),
            "customer": customer_label(conversation),
            "vip": handoff.vip,
            "title": handoff.title or "",
            "last_message": handoff.last_text or "",
            "last_from": handoff.last_role or "",
            "requested_at": handoff_events.iso(handoff.requested_at),
        }

    return {
        "now": handoff_events.iso(now),
        "target_s": HandoffSettings.load().first_response_target_s,
        "me": {
            "id": agent.pk,
            "display_name": names[agent.pk],
            "load": answering.get(agent.pk, 0),
            "capacity": capacities.get(agent.pk, default_capacity),
            "online": agent.pk in online,
        },
        "agents_online": sorted(
            (
                {
                    "name": names[agent_id],
                    "load": answering.get(agent_id, 0),
                    "capacity": capacities.get(agent_id, default_capacity),
                }
                for agent_id in online
            ),
            key=lambda entry: entry["name"],
        ),
        "waiting": [
            {
                **row(h),
                "offered_to_me": offered.get(str(h.conversation_id)) == agent.pk,
                "offered_to": names.get(offered[str(h.conversation_id)])
                if str(h.conversation_id) in offered
                else None,
                "left_question": h.agents_online == 0,
            }
            for h in waiting
        ],
        "mine": [
            {
                **row(h),
                "claimed_at": handoff_events.iso(h.claimed_at),
                "awaiting_reply": h.last_role == "user",
            }
            for h in mine
        ],
        "resolved_today": [
            {
                **row(h),
                "resolved_at": handoff_events.iso(h.ended_at),
                "rating": h.rating,
                "agent": h.agent_id == agent.pk,
            }
            for h in resolved
        ],
    }


# --- a conversation, as the team reads it ------------------------------------------------------------


def _message_row(message: Message) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": message.pk,
        "role": message.role,
        "text": message.content,
        "author": message.author_name or None,
        "at": handoff_events.iso(message.created_at),
    }
    if message.role == Message.Role.ASSISTANT:
        answer = message.generation
        row.update(
            text=answer.text if answer is not None else "",
            status=answer.status if answer is not None else Generation.Status.PENDING,
            engine=(answer.engine.partition(":")[0] if answer is not None else ""),
            variant=answer.variant if answer is not None else "",
            sources=message.sources,
            feedback=message.feedback,
        )
    return row


def conversation_transcript(*, conversation_id: UUID, agent: User) -> dict[str, Any]:
    """Everything the team knows of a conversation: the customer's messages, the assistant's
    answers with their sources and thumbs, the agents' messages and private notes, each
    hand-off, and the earlier conversations of a signed-in customer. Raises
    Conversation.DoesNotExist."""
    events_after = handoff_events.stream_last_id(str(conversation_id))  # before reading: see its doc
    conversation = Conversation.objects.select_related("owner", "assignee").get(pk=conversation_id)
    messages = conversation.messages.select_related("generation")
    notes = AgentNote.objects.filter(conversation=conversation)
    handoffs = list(conversation.handoffs.select_related("agent"))
    earlier: list[dict[str, Any]] = []
    if conversation.owner_id is not None:
        for previous in (
            Conversation.objects.filter(
                owner_id=conversation.owner_id, created_at__lt=conversation.created_at
            )
            .order_by("-created_at")
            .annotate(first=Left(_first_of_conversation(), _TITLE_CHARS))[:EARLIER_CONVERSATIONS]
        ):
            earlier.append(
                {
                    "id": str(previous.pk),
                    "started_at": handoff_events.iso(previous.created_at),
                    "state": previous.handoff_state,
                    "title": previous.first or "",
                    "messages": [
                        _message_row(m)
                        for m in previous.messages.select_related("generation").order_by("created_at", "id")[
                            :EARLIER_MESSAGES
                        ]
                    ],
                }
            )
    agent_names = _display_names({h.agent_id for h in handoffs if h.agent_id is not None})
    vip = bool(handoffs and handoffs[-1].vip) or (
        conversation.owner is not None and conversation.owner.is_vip
    )
    return {
        "id": str(conversation.pk),
        "customer": customer_label(conversation),
        "signed_in": conversation.owner_id is not None,
        "vip": vip,
        "state": conversation.handoff_state,
        "assignee": _display_names({conversation.assignee_id})[conversation.assignee_id]
        if conversation.assignee_id is not None
        else None,
        "assigned_to_me": conversation.assignee_id == agent.pk,
        "messages": [_message_row(m) for m in messages],
        "notes": [
            {"id": n.pk, "author": n.author_name, "text": n.text, "at": handoff_events.iso(n.created_at)}
            for n in notes
        ],
        "handoffs": [
            {
                "trigger": h.get_trigger_display(),
                "requested_at": handoff_events.iso(h.requested_at),
                "claimed_at": handoff_events.iso(h.claimed_at) if h.claimed_at else None,
                "agent": agent_names.get(h.agent_id) if h.agent_id is not None else None,
                "ended_at": handoff_events.iso(h.ended_at) if h.ended_at else None,
                "outcome": h.get_outcome_display() if h.outcome else None,
                "rating": h.rating,
                "comment": h.rating_comment,
            }
            for h in handoffs
        ],
        "earlier": earlier,
        "events_after": events_after,
    }


def _first_of_conversation() -> Subquery:
    return Subquery(
        Message.objects.filter(conversation=OuterRef("pk"), role=Message.Role.USER)
        .order_by("created_at", "id")
        .values("content")[:1]
    )
