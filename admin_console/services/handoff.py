"""Hand-off to a person: everything an agent does in the inbox is audited.

The transitions and their rules are chat.handoff's; here each one is recorded with who did it.
"""

from __future__ import annotations

from uuid import UUID

from django.db import transaction

from accounts.models import User
from admin_console.models import AuditLog
from admin_console.services.audit import _audit
from chat import handoff
from chat.models import AgentNote, AgentProfile, Conversation, HandoffSettings, Message


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
