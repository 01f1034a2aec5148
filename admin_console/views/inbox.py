"""The agents' inbox: conversations handed off to a person.

Its views are for agents only (admin_console.access.agent_required): the page, whose lists
admin_console.inbox_socket pushes live as data, and the actions, which answer JSON for the
page's script (and a redirect for a plain form).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from admin_console.access import agent_required
from admin_console.forms import AgentProfileForm, HandoffTargetForm
from admin_console.services import handoff as handoff_services
from chat import handoff
from chat.handoff_selectors import conversation_transcript, inbox_snapshot
from chat.models import Conversation, HandoffSettings


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def _wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


@require_GET
@agent_required
def inbox(request: HttpRequest) -> HttpResponse:
    profile = handoff.agent_profile(request.user)
    return render(
        request,
        "admin_console/inbox.html",
        {
            "section": "inbox",
            "snapshot": inbox_snapshot(agent=request.user),
            "profile_form": AgentProfileForm(instance=profile),
            "target_form": HandoffTargetForm(instance=HandoffSettings.load()),
            "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
            "presence_beat_s": settings.HANDOFF_PRESENCE_BEAT_S,
        },
    )


@require_GET
@agent_required
def inbox_snapshot_view(request: HttpRequest) -> HttpResponse:
    """The inbox's lists, read by the page while its socket is down."""
    return JsonResponse(inbox_snapshot(agent=request.user))


@require_GET
@agent_required
def conversation_view(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    try:
        return JsonResponse(conversation_transcript(conversation_id=conversation_id, agent=request.user))
    except Conversation.DoesNotExist:
        return _error(404, "not_found", "This conversation does not exist.")


def _acted(request: HttpRequest, conversation_id: UUID, act: Any, status: int = 200) -> HttpResponse:
    """Run an agent's action; its outcome as JSON: the conversation as it is now, or the error."""
    try:
        done = act()
    except Conversation.DoesNotExist:
        return _error(404, "not_found", "This conversation does not exist.")
    except handoff.HandoffRejected as exc:
        return _error(400, "invalid_message", str(exc))
    except handoff.HandoffConflict as exc:
        return _error(409, "handoff_conflict", str(exc))
    except handoff.NotAnAgent as exc:
        return _error(403, "not_an_agent", str(exc))
    if not _wants_json(request):
        return redirect("console:inbox")
    return JsonResponse(done if isinstance(done, dict) else {"done": True}, status=status)


@require_POST
@agent_required
def conversation_claim(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """Two agents claiming at once: one gets it, the other a 409 saying so."""
    return _acted(
        request,
        conversation_id,
        lambda: handoff_services.handoff_claim(agent=request.user, conversation_id=conversation_id),
    )


@require_POST
@agent_required
def conversation_reply(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    def reply() -> dict[str, Any]:
        message = handoff_services.handoff_reply(
            agent=request.user, conversation_id=conversation_id, text=request.POST.get("text", "")
        )
        return {
            "id": message.pk,
            "role": message.role,
            "text": message.content,
            "author": message.author_name,
        }

    return _acted(request, conversation_id, reply, status=201)


@require_POST
@agent_required
def conversation_note(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    def note() -> dict[str, Any]:
        saved = handoff_services.handoff_note(
            agent=request.user, conversation_id=conversation_id, text=request.POST.get("text", "")
        )
        return {
            "id": saved.pk,
            "author": saved.author_name,
            "text": saved.text,
            "at": saved.created_at.isoformat(),
        }

    return _acted(request, conversation_id, note, status=201)


@require_POST
@agent_required
def conversation_hand_back(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    return _acted(
        request,
        conversation_id,
        lambda: handoff_services.handoff_hand_back(agent=request.user, conversation_id=conversation_id),
    )


@require_POST
@agent_required
def conversation_resolve(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    return _acted(
        request,
        conversation_id,
        lambda: handoff_services.handoff_resolve(agent=request.user, conversation_id=conversation_id),
    )


@require_POST
@agent_required
def agent_profile(request: HttpRequest) -> HttpResponse:
    form = AgentProfileForm(request.POST)
    if form.is_valid():
        try:
            handoff_services.agent_profile_set(agent=request.user, **form.cleaned_data)
        except ValidationError as exc:
            messages.error(request, " ".join(exc.messages))
        else:
            messages.success(request, "Saved: customers see you by that name.")
    else:
        messages.error(request, "A display name of at most 60 characters, and a capacity from 1 to 20.")
    return redirect("console:inbox")


@require_POST
@agent_required
def handoff_target(request: HttpRequest) -> HttpResponse:
    form = HandoffTargetForm(request.POST)
    if form.is_valid():
        handoff_services.handoff_target_set(
            actor=request.user, first_response_target_s=form.cleaned_data["first_response_target_s"]
        )
        messages.success(request, "First-response target saved.")
    else:
        messages.error(request, "The target is a whole number of seconds from 10 to 86400.")
    return redirect("console:inbox")
