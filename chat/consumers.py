"""The answer stream, `GET /chat/stream/<request_id>`: a request's result events as server-sent
events, served by Channels from the ASGI scope rather than by a Django view. A conversation's
hand-off events, `GET /chat/<conversation_id>/events`, are served the same way.

A stream is opened for every answer and again on every reconnect (a dropped connection, a web
host that died, a reloaded page), and all it needs is who the client is and whether the
request is theirs. Through Django's handler an open cost about 12 ms of the web process's CPU:
its per-request thread, and every middleware of the chain run in that thread before and after
the view. Here the cookies are read from the scope, and the session, the account and the
request's owner are read in one hop to a thread; the relay (chat.relay) is the same.

Not Channels' `AsyncHttpConsumer`: it gives every connection a channel on the channel layer,
which a stream does not use, and it reads no more messages from the client while `handle()`
runs, so a client that left would not be noticed until its stream ended.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import aclosing
from importlib import import_module
from types import SimpleNamespace
from typing import TYPE_CHECKING
from urllib.parse import parse_qs
from uuid import UUID

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib import auth
from django.db import OperationalError
from django.http.cookie import parse_cookie

from accounts.addresses import peer_client_address
from accounts.models import User
from chat import guests, selectors
from chat.models import Conversation, Message
from chat.relay import relay_conversation, relay_events
from chat.sse import SSE_HEADERS
from scheduler.rate_limits import address_scope
from scheduler.results import parse_event_id

if TYPE_CHECKING:
    from asgiref.typing import ASGIReceiveCallable, ASGISendCallable, HTTPScope

logger = logging.getLogger(__name__)

# Served by Channels, not by a view of the URLconf (chat/routing.py mounts it).
_STREAM_PREFIX = "chat/stream/"
STREAM_ROUTE = _STREAM_PREFIX + "<uuid:request_id>"
EVENTS_ROUTE = "chat/<uuid:conversation_id>/events"


def stream_url(request_id: UUID | str) -> str:
    """Where the browser reads a request's answer."""
    return f"/{_STREAM_PREFIX}{request_id}"


def events_url(conversation_id: UUID | str) -> str:
    """Where the browser reads a conversation's hand-off events."""
    return f"/chat/{conversation_id}/events"


_HEADERS = [
    (b"content-type", b"text/event-stream"),
    *((name.lower().encode(), value.encode()) for name, value in SSE_HEADERS.items()),
    (b"x-content-type-options", b"nosniff"),
    (b"vary", b"Cookie"),
]


def _client(cookies: dict[str, str]) -> tuple[User | None, str]:
    """The signed-in customer of the session cookie, or the key of the guest cookie."""
    session_key = cookies.get(settings.SESSION_COOKIE_NAME)
    if session_key:
        session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
        user = auth.get_user(SimpleNamespace(session=session))  # checks the session's password hash
        if user.is_authenticated:
            return user, ""
    return None, guests.guest_key_in(cookies)


def _client_id(user: User | None, guest_key: str) -> str:
    return guests.account_client_id(user.pk) if user is not None else guests.guest_client_id(guest_key)


def _owned_answer(request_id: UUID, cookies: dict[str, str]) -> tuple[Message, str]:
    """The answer and its client's id. Raises Message.DoesNotExist for unknown requests and for
    other clients'."""
    user, guest_key = _client(cookies)
    message = selectors.assistant_message_get(request_id=request_id, user=user, session_key=guest_key)
    return message, _client_id(user, guest_key)


class _OpenStreams:
    """The streams this web process holds open, per client and per address: a client opening
    ever more (each open is a database read and a watcher of the results) is refused past
    STREAMS_MAX_PER_CLIENT, and an address past STREAMS_MAX_PER_ADDRESS, while everyone else's
    keep flowing."""

    def __init__(self) -> None:
        self._open: Counter[str] = Counter()

    def take(self, *, client_id: str, address: str) -> tuple[str, str] | None:
        """The counters taken for one more stream (give them back with `give_back`), or None:
        refused."""
        held = (f"client:{client_id}", f"address:{address_scope(address)}")
        caps = (settings.STREAMS_MAX_PER_CLIENT, settings.STREAMS_MAX_PER_ADDRESS)
        if any(self._open[key] >= cap for key, cap in zip(held, caps, strict=True)):
            return None
        self._open.update(held)
        return held

    def give_back(self, held: tuple[str, str]) -> None:
        self._open.subtract(held)
        for key in held:
            if self._open[key] <= 0:
                del self._open[key]


_open_streams = _OpenStreams()


def _address(scope: HTTPScope, headers: dict[str, str]) -> str:
    peer = scope["client"][0] if scope.get("client") else ""
    return peer_client_address(peer, headers.get("x-forwarded-for"))


_Headers = tuple[tuple[bytes, bytes], ...]


async def _respond(send: ASGISendCallable, status: int, code: str, text: str, headers: _Headers = ()) -> None:
    """An error in the chat's JSON shape."""
    body = json.dumps({"error": {"code": code, "message": text}}).encode()
    start = [(b"content-type", b"application/json"), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


async def answer_stream(scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    if scope["method"] != "GET":
        only_get = "Read an answer's stream with GET."
        await _respond(send, 405, "method_not_allowed", only_get, ((b"allow", b"GET"),))
        return
    request_id: UUID = scope["url_route"]["kwargs"]["request_id"]  # type: ignore[typeddict-item]
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
    cookies = parse_cookie(headers.get("cookie", ""))
    try:
        # One hop to a shared thread for the session, account and ownership reads together;
        # it hands its database connection back, so an open stream holds none.
        message, client_id = await database_sync_to_async(_owned_answer, thread_sensitive=False)(
            request_id, cookies
        )
    except Message.DoesNotExist:
        await _respond(send, 404, "not_found", "This request does not exist.")
        return
    except OperationalError as exc:
        logger.warning("database busy, refused the stream of %s: %s", request_id, exc)
        busy = "The service is busy. Please try again in a moment."
        await _respond(send, 503, "database_busy", busy, ((b"retry-after", b"2"),))
        return
    events = relay_events(
        model=message.generation.model,
        request_id=str(request_id),
        after_id=parse_event_id(headers.get("last-event-id")),
    )
    await _stream(events, receive, send, f"the stream of {request_id}", client_id, _address(scope, headers))


def _owned_conversation(conversation_id: UUID, cookies: dict[str, str]) -> tuple[Conversation, str]:
    """The conversation and its client's id. Raises Conversation.DoesNotExist for conversations
    not stored and for other clients'."""
    user, guest_key = _client(cookies)
    conversation = selectors.conversation_find(
        conversation_id=conversation_id, user=user, session_key=guest_key
    )
    if conversation is None:
        raise Conversation.DoesNotExist(f"No conversation {conversation_id}.")
    return conversation, _client_id(user, guest_key)


async def conversation_events(scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    """The customer's page follows a hand-off here: from `Last-Event-ID` when the browser
    reconnects, else from `?after=` (the stream's last id when the page read the database),
    with the same checks, caps and heartbeats as an answer's stream."""
    if scope["method"] != "GET":
        only_get = "Read a conversation's events with GET."
        await _respond(send, 405, "method_not_allowed", only_get, ((b"allow", b"GET"),))
        return
    conversation_id: UUID = scope["url_route"]["kwargs"]["conversation_id"]  # type: ignore[typeddict-item]
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
    cookies = parse_cookie(headers.get("cookie", ""))
    try:
        conversation, client_id = await database_sync_to_async(_owned_conversation, thread_sensitive=False)(
            conversation_id, cookies
        )
    except Conversation.DoesNotExist:
        await _respond(send, 404, "not_found", "This conversation does not exist.")
        return
    except OperationalError as exc:
        logger.warning("database busy, refused the events of %s: %s", conversation_id, exc)
        busy = "The service is busy. Please try again in a moment."
        await _respond(send, 503, "database_busy", busy, ((b"retry-after", b"2"),))
        return
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    resume = headers.get("last-event-id") or (query.get("after") or [""])[0]
    events = relay_conversation(
        conversation_id=str(conversation_id),
        after_id=parse_event_id(resume),
        waiting=conversation.handoff_state == Conversation.HandoffState.WAITING,
    )
    await _stream(
        events, receive, send, f"the events of {conversation_id}", client_id, _address(scope, headers)
    )


async def _stream(
    events: AsyncIterator[bytes],
    receive: ASGIReceiveCallable,
    send: ASGISendCallable,
    what: str,
    client_id: str,
    address: str,
) -> None:
    """Send the SSE response: its headers, then the relay's frames until it ends or the client
    leaves; or 429 when the client or its address holds too many streams open already."""
    held = _open_streams.take(client_id=client_id, address=address)
    if held is None:
        too_many = "Too many answers are open at once. Please close some tabs and try again."
        await _respond(send, 429, "too_many_streams", too_many, ((b"retry-after", b"5"),))
        return
    try:
        await _relay_until_gone(events, receive, send, what)
    finally:
        _open_streams.give_back(held)


async def _relay_until_gone(
    events: AsyncIterator[bytes], receive: ASGIReceiveCallable, send: ASGISendCallable, what: str
) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    relaying = asyncio.ensure_future(_relay(events, send))
    leaving = asyncio.ensure_future(_disconnected(receive))
    await asyncio.wait({relaying, leaving}, return_when=asyncio.FIRST_COMPLETED)
    for task in (relaying, leaving):
        task.cancel()
    # A client that left cancels the relay, which stops counting it as a watcher.
    relayed, _ = await asyncio.gather(relaying, leaving, return_exceptions=True)
    if isinstance(relayed, Exception):
        logger.error("%s failed", what, exc_info=relayed)


async def _relay(events: AsyncIterator[bytes], send: ASGISendCallable) -> None:
    async with aclosing(events):
        async for frame in events:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _disconnected(receive: ASGIReceiveCallable) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
