"""Chat views: parse, check access, call one service or selector, render or stream."""

from __future__ import annotations

from uuid import UUID

from channels.db import database_sync_to_async
from django.conf import settings
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.middleware import HtmxDetails

from chat import selectors, services
from chat.models import Conversation, Message, User
from chat.relay import relay_events
from chat.sse import SSE_HEADERS
from scheduler.admission import AdmissionRefused
from scheduler.results import parse_event_id


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def _session_key(request: HttpRequest) -> str:
    """Guests are identified by their session; make sure they have one."""
    if not request.session.session_key:
        request.session.save()
    return request.session.session_key or ""


def _client(request: HttpRequest) -> tuple[User | None, str]:
    user = request.user if request.user.is_authenticated else None
    return user, request.session.session_key or ""


def _client_id(request: HttpRequest) -> str:
    if request.user.is_authenticated:
        return f"user:{request.user.pk}"
    return f"session:{_session_key(request)}"


def _guest_address(request: HttpRequest) -> str | None:
    """A guest's network address (for the per-address bucket): the peer, or the address the
    trusted proxy in front of us saw. Accounts are limited per account instead."""
    if request.user.is_authenticated:
        return None
    address = request.META.get("REMOTE_ADDR", "")
    forwarded = request.headers.get("X-Forwarded-For")
    if forwarded and address in settings.TRUSTED_PROXIES:
        address = forwarded.split(",")[-1].strip()
    return address or None


def _tier(request: HttpRequest) -> str:
    return request.user.tier if request.user.is_authenticated else User.Tier.NORMAL


def _wants_json(request: HtmxHttpRequest) -> bool:
    return not request.htmx and "application/json" in request.headers.get("Accept", "")


def _error(status: int, code: str, message: str, retry_after_s: int | None = None) -> JsonResponse:
    response = JsonResponse({"error": {"code": code, "message": message}}, status=status)
    if retry_after_s is not None:
        response["Retry-After"] = str(retry_after_s)
    return response


def _conversation_or_404(request: HttpRequest, conversation_id: UUID) -> Conversation:
    user, session_key = _client(request)
    try:
        return selectors.conversation_get(conversation_id=conversation_id, user=user, session_key=session_key)
    except Conversation.DoesNotExist as exc:
        raise Http404("No such conversation.") from exc


def _render_page(request: HtmxHttpRequest, conversation: Conversation) -> HttpResponse:
    user, session_key = _client(request)
    return render(
        request,
        "chat/page.html",
        {
            "conversation": conversation,
            "messages": selectors.conversation_messages(conversation=conversation),
            "conversations": selectors.conversation_list(user=user, session_key=session_key),
            "tier": _tier(request),
        },
    )


@require_GET
def home(request: HtmxHttpRequest) -> HttpResponse:
    user, _ = _client(request)
    session_key = _session_key(request)
    conversation = selectors.conversation_latest(user=user, session_key=session_key)
    if conversation is None:
        conversation = services.conversation_create(owner=user, session_key=session_key)
    return _render_page(request, conversation)


@require_GET
def conversation_page(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    return _render_page(request, _conversation_or_404(request, conversation_id))


@require_POST
def conversation_new(request: HtmxHttpRequest) -> HttpResponse:
    user, _ = _client(request)
    conversation = services.conversation_create(owner=user, session_key=_session_key(request))
    url = reverse("chat:conversation", args=[conversation.pk])
    if _wants_json(request):
        return JsonResponse({"id": str(conversation.pk), "url": url}, status=201)
    return redirect(url)


@require_POST
def message_post(request: HtmxHttpRequest, conversation_id: UUID) -> HttpResponse:
    try:
        conversation = _conversation_or_404(request, conversation_id)
    except Http404:
        return _error(404, "not_found", "This conversation does not exist.")
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
    admission = posted.admission
    if _wants_json(request):
        return JsonResponse(
            {
                "request_id": admission.request_id,
                "message_id": posted.assistant_message.pk,
                "tier": admission.tier,
                "position": admission.position,
                "predicted_wait_s": round(admission.predicted_wait_s, 1),
                "stream_url": reverse("chat:stream", args=[admission.request_id]),
            },
            status=202,
        )
    return render(
        request,
        "chat/_exchange.html",
        {"user_message": posted.user_message, "assistant_message": posted.assistant_message},
        status=202,
    )


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


@require_GET
async def stream(request: HttpRequest, request_id: UUID) -> HttpResponse:
    def owned_message() -> Message:
        user, session_key = _client(request)
        return selectors.assistant_message_get(request_id=request_id, user=user, session_key=session_key)

    try:
        # One hop to a shared thread for the session, user and ownership reads together: a
        # thread-sensitive hop would start and join a thread for every stream. The hop hands its
        # database connection back, so an open stream holds none.
        message = await database_sync_to_async(owned_message, thread_sensitive=False)()
    except Message.DoesNotExist as exc:
        raise Http404("No such request.") from exc
    events = relay_events(
        variant=message.variant,
        request_id=str(request_id),
        after_id=parse_event_id(request.headers.get("Last-Event-ID")),
    )
    return StreamingHttpResponse(events, content_type="text/event-stream", headers=SSE_HEADERS)
