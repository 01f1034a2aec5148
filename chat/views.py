"""Chat views: parse, check access, call one service or selector, render. The answer stream is
Channels' (chat/consumers.py)."""

from __future__ import annotations

import json
from uuid import UUID

from django.conf import settings
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.middleware import HtmxDetails

from accounts.addresses import client_address
from accounts.models import User
from chat import guests, handoff, selectors, services
from chat.consumers import events_url, stream_url
from chat.handoff_events import stream_last_id
from chat.models import Conversation, Handoff, Message
from scheduler.admission import AdmissionRefused
from scheduler.generation import Tier


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def _client(request: HttpRequest) -> tuple[User | None, str]:
    """The signed-in customer, or the key of the guest (empty for a guest not yet seen)."""
    if request.user.is_authenticated:
        return request.user, ""
    return None, guests.guest_key_known(request)


def _client_id(request: HttpRequest) -> str:
    """Who admission's per-client limits (and an A/B experiment's arms) count."""
    if request.user.is_authenticated:
        return guests.account_client_id(request.user.pk)
    return guests.guest_client_id(guests.guest_key(request))


def _guest_address(request: HttpRequest) -> str | None:
    """A guest's network address (for the per-address bucket). Accounts are limited per account
    instead."""
    if request.user.is_authenticated:
        return None
    return client_address(request) or None


def _tier(request: HttpRequest) -> str:
    return request.user.tier if request.user.is_authenticated else Tier.NORMAL


def _wants_json(request: HtmxHttpRequest) -> bool:
    return not request.htmx and "application/json" in request.headers.get("Accept", "")


def _error(status: int, code: str, message: str, retry_after_s: int | None = None) -> JsonResponse:
    response = JsonResponse({"error": {"code": code, "message": message}}, status=status)
    if retry_after_s is not None:
        response["Retry-After"] = str(retry_after_s)
    return response


def _conversation_or_404(request: HttpRequest, conversation_id: UUID) -> Conversation:
    """The client's conversation, or a new one (unsaved) when the id was offered to be one."""
    user, session_key = _client(request)
    try:
        conversation = selectors.conversation_find(
            conversation_id=conversation_id, user=user, session_key=session_key
        )
    except Conversation.DoesNotExist as exc:
        raise Http404("No such conversation.") from exc
    if conversation is not None:
        return conversation
    if not services.conversation_id_offered(conversation_id):
        raise Http404("No such conversation.")
    return services.conversation_new(conversation_id=conversation_id, owner=user, session_key=session_key)


def _render_page(request: HtmxHttpRequest, conversation: Conversation) -> HttpResponse:
    if not request.user.is_authenticated:
        guests.guest_key(request)  # the page's posts, however many at once, share this key
    user, session_key = _client(request)
    return render(
        request,
        "chat/page.html",
        {
            "conversation": conversation,
            # Offered but not stored until its first message: listed on top as the current one.
            "conversation_is_new": conversation._state.adding,
            "messages": selectors.conversation_messages(conversation=conversation),
            "conversations": selectors.conversation_list(user=user, session_key=session_key),
            "max_message_chars": settings.CHAT_MAX_MESSAGE_CHARS,
            "handoff": selectors.handoff_view(conversation=conversation),
        },
    )


@require_GET
@guests.remembering
def home(request: HtmxHttpRequest) -> HttpResponse:
    user, session_key = _client(request)
    conversation = selectors.conversation_latest(user=user, session_key=session_key)
    if conversation is None:
        conversation = services.conversation_new(
            conversation_id=services.conversation_id_offer(), owner=user, session_key=session_key
        )
    return _render_page(request, conversation)


@require_GET
@guests.remembering
def conversation_page(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    return _render_page(request, _conversation_or_404(request, conversation_id))


@require_POST
def conversation_new(request: HtmxHttpRequest) -> HttpResponse:
    """A fresh conversation id; the conversation is stored when its first message is posted."""
    conversation_id = services.conversation_id_offer()
    url = reverse("chat:conversation", args=[conversation_id])
    if _wants_json(request):
        return JsonResponse({"id": str(conversation_id), "url": url}, status=201)
    return redirect(url)


@require_POST
@guests.remembering
def message_post(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    try:
        conversation = _conversation_or_404(request, conversation_id)
    except Http404:
        return _error(404, "not_found", "This conversation does not exist.")
    if conversation._state.adding and not request.user.is_authenticated:
        conversation.session_key = guests.guest_key(request)  # a guest's first message
    try:
        posted = services.message_post(
            conversation=conversation,
            text=request.POST.get("text", ""),
            tier=_tier(request),
            client_id=_client_id(request),
            client_address=_guest_address(request),
        )
    except services.MessageRejected as exc:
        return _error(400, "invalid_message", str(exc))
    except services.ConversationBusy as exc:
        return _error(409, "conversation_busy", str(exc))
    except AdmissionRefused as exc:
        return _error(exc.status, exc.reason, exc.message, exc.retry_after_s)
    except handoff.HandoffConflict as exc:
        return _error(409, "handoff_conflict", str(exc))
    if isinstance(posted, handoff.HeldMessage):
        return _held_message(request, posted)
    admission = posted.admission
    if _wants_json(request):
        return JsonResponse(
            {
                "request_id": admission.request_id,
                "message_id": posted.assistant_message.pk,
                "tier": admission.tier,
                "position": admission.position,
                "predicted_wait_s": round(admission.predicted_wait_s, 1),
                "stream_url": stream_url(admission.request_id),
            },
            status=202,
        )
    return render(
        request,
        "chat/_exchange.html",
        {"user_message": posted.user_message, "assistant_message": posted.assistant_message},
        status=202,
    )


def _handoff_state(conversation: Conversation, *, agents_online: int | None = None) -> dict:
    view = selectors.handoff_view(conversation=conversation)
    return {
        "state": view.state,
        "agent": view.agent,
        "rate_handoff": view.rate_handoff,
        "agents_online": agents_online,
        "events_url": events_url(conversation.pk),
        "events_after": view.events_after,
    }


def _held_message(request: HtmxHttpRequest, held: handoff.HeldMessage) -> HttpResponse:
    """A message kept for a person: no answer comes, and the page learns the hand-off's state
    (htmx: as the `handoff` event)."""
    state = {"state": held.handoff_state, "agents_online": held.agents_online}
    if _wants_json(request):
        return JsonResponse({"message_id": held.user_message.pk, "handoff": state}, status=201)
    response = render(request, "chat/_exchange.html", {"user_message": held.user_message}, status=201)
    response["HX-Trigger"] = json.dumps({"handoff": state})
    return response


def _message_data(message: Message) -> dict:
    return {
        "id": message.pk,
        "role": message.role,
        "text": message.content,
        "author": message.author_name or None,
        "at": message.created_at.isoformat(),
    }


_TRIGGERS = {Handoff.Trigger.BUTTON, Handoff.Trigger.THUMBS_DOWN, Handoff.Trigger.DECLINE}


@require_POST
@guests.remembering
def handoff_request(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """ "Talk to a person" (the button, or its offer under a decline or a second thumbs-down)."""
    try:
        conversation = _conversation_or_404(request, conversation_id)
    except Http404:
        return _error(404, "not_found", "This conversation does not exist.")
    trigger = request.POST.get("trigger", Handoff.Trigger.BUTTON)
    if trigger not in _TRIGGERS:
        return _error(400, "invalid_trigger", "Ask for a person with the button.")
    if conversation._state.adding and not request.user.is_authenticated:
        conversation.session_key = guests.guest_key(request)
    # Read before the request is stored: the page's stream then starts with its event.
    events_after = stream_last_id(str(conversation.pk))
    try:
        requested = handoff.handoff_request(
            conversation=conversation, trigger=Handoff.Trigger(trigger), tier=_tier(request)
        )
    except handoff.HandoffConflict as exc:
        return _error(409, "handoff_conflict", str(exc))
    if not _wants_json(request):
        return redirect("chat:conversation", conversation.pk)
    state = _handoff_state(conversation, agents_online=requested.agents_online)
    return JsonResponse({**state, "events_after": events_after}, status=201)


def _stored_conversation(request: HttpRequest, conversation_id: UUID) -> Conversation | None:
    """The client's stored conversation, or None (another client's, or never stored)."""
    user, session_key = _client(request)
    try:
        return selectors.conversation_find(
            conversation_id=conversation_id, user=user, session_key=session_key
        )
    except Conversation.DoesNotExist:
        return None


@require_POST
def handoff_withdraw(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """The customer stops waiting for a person: the assistant answers again."""
    conversation = _stored_conversation(request, conversation_id)
    if conversation is None:
        return _error(404, "not_found", "This conversation does not exist.")
    try:
        handoff.handoff_withdraw(conversation=conversation)
    except handoff.HandoffConflict as exc:
        return _error(409, "handoff_conflict", str(exc))
    if not _wants_json(request):
        return redirect("chat:conversation", conversation.pk)
    return JsonResponse(_handoff_state(conversation))


@require_GET
def handoff_state(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """Where the hand-off stands, and the messages after `after` (a message id): what a page
    reads again when its stream reconnects, so that nothing sent meanwhile is missed."""
    conversation = _stored_conversation(request, conversation_id)
    if conversation is None:
        return _error(404, "not_found", "This conversation does not exist.")
    try:
        after = int(request.GET.get("after", "0"))
    except ValueError:
        return _error(400, "invalid_after", "`after` is a message id.")
    state = _handoff_state(conversation)
    messages = selectors.handoff_messages(conversation=conversation, after_message_id=after)
    return JsonResponse({**state, "messages": [_message_data(m) for m in messages]})


@require_POST
def handoff_typing(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """The customer is typing: the agent's page shows it (nothing is stored)."""
    conversation = _stored_conversation(request, conversation_id)
    if conversation is None:
        return _error(404, "not_found", "This conversation does not exist.")
    if conversation.handoff_state not in handoff.WITH_A_PERSON:
        return _error(409, "handoff_conflict", "Nobody from our team is in this conversation.")
    handoff.typing_publish(conversation=conversation, who="customer")
    return HttpResponse(status=204)


@require_POST
def handoff_rating(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    """The customer rates the person who resolved the conversation: 1-5 and a comment, once."""
    conversation = _stored_conversation(request, conversation_id)
    if conversation is None:
        return _error(404, "not_found", "This conversation does not exist.")
    try:
        rating = int(request.POST.get("rating", ""))
    except ValueError:
        return _error(400, "invalid_rating", "Choose a rating from 1 to 5.")
    try:
        handoff.handoff_rate(
            conversation=conversation, rating=rating, comment=request.POST.get("comment", "")
        )
    except handoff.HandoffRejected as exc:
        return _error(400, "invalid_rating", str(exc))
    except handoff.HandoffConflict as exc:
        return _error(409, "handoff_conflict", str(exc))
    if not _wants_json(request):
        return redirect("chat:conversation", conversation.pk)
    return JsonResponse({"rating": rating}, status=201)


@require_POST
def request_cancel(request: HttpRequest, request_id: UUID) -> HttpResponse:
    user, session_key = _client(request)
    try:
        message = selectors.assistant_message_get(request_id=request_id, user=user, session_key=session_key)
    except Message.DoesNotExist:
        return _error(404, "not_found", "This request does not exist.")
    cancelled = services.request_cancel(message=message)
    return JsonResponse({"request_id": str(request_id), "cancelling": cancelled}, status=202)


_FEEDBACK_VALUES = {"up": Message.Feedback.UP, "down": Message.Feedback.DOWN}


@require_POST
def message_feedback(request: HtmxHttpRequest, message_id: int) -> HttpResponse:
    # Votes steer the canary: a guest could make throwaway sessions and vote as many times.
    if not request.user.is_authenticated:
        return _error(403, "sign_in_required", "Sign in to rate answers.")
    user, session_key = _client(request)
    try:
        message = selectors.assistant_message_owned(message_id=message_id, user=user, session_key=session_key)
    except Message.DoesNotExist:
        return _error(404, "not_found", "This answer does not exist.")
    feedback = _FEEDBACK_VALUES.get(request.POST.get("value", ""))
    if feedback is None:
        return _error(400, "invalid_feedback", "Feedback is either up or down.")
    try:
        services.message_feedback_set(message=message, feedback=feedback)
    except services.FeedbackRejected as exc:
        return _error(409, "not_finished", str(exc))
    if request.htmx:
        return render(request, "chat/_feedback.html", {"message": message})
    if _wants_json(request):
        return JsonResponse({"message_id": message.pk, "feedback": request.POST["value"]})
    return redirect("chat:conversation", message.conversation_id)
