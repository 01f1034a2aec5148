"""Overload at the door: a bound on the sync views a web process runs at once, and the answer
when the database cannot take a request in time; and the Content-Security-Policy header."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING
from weakref import WeakKeyDictionary

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.urls import Resolver404, resolve, set_script_prefix
from django.utils.deprecation import MiddlewareMixin

if TYPE_CHECKING:
    from asgiref.typing import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope

logger = logging.getLogger(__name__)

# A burst passes in seconds: the lock or the pooled connection that was busy is free by then.
BUSY_RETRY_AFTER_S = 2


def _busy_response(code: str) -> JsonResponse:
    """503 with Retry-After; the body fits both the chat's and the OpenAI API's error shapes."""
    response = JsonResponse(
        {
            "error": {
                "message": "The service is busy. Please try again in a moment.",
                "type": "service_unavailable",
                "param": None,
                "code": code,
            }
        },
        status=503,
    )
    response["Retry-After"] = str(BUSY_RETRY_AFTER_S)
    return response


def _view_is_sync(scope: Scope) -> bool:
    try:
        match = resolve(scope["path"].removeprefix(scope.get("root_path", "")))
    except Resolver404:
        return False
    return not iscoroutinefunction(match.func)


class SyncViewGate:
    """ASGI middleware in front of Django's handler: at most WEB_SYNC_VIEWS_MAX requests for
    sync views go on at once in a web process; the others wait here, on the event loop, at most
    WEB_SYNC_VIEW_WAIT_S, then are refused with 503 and Retry-After.

    Under ASGI nothing else bounds them: Django gives each request a thread of its own (before
    any middleware, for the request_started signal), and every sync middleware of the chain is
    a round trip between that thread and the event loop, before the view and after it. A burst
    of 500 posts was 500 threads queueing for 20 pooled connections; the ones the pool refused
    after its timeout then queued again, for the loop and the GIL, behind thousands of other
    requests' round trips, so their 503 reached the client 7 s after the refusal, and
    the SSE streams' reads, queueing for a connection behind them, timed out. Waiting here takes
    no thread, no round trip and no connection; a request holds its turn until its response is
    sent and its connection handed back, so the views let in never wait long for one.

    A turn is also a thread: each of the WEB_SYNC_VIEWS_MAX turns is a long-lived one-thread
    executor, lent to the request as its thread-sensitive context for Django's middleware and
    view. Without it Django starts a thread for every request and, when the request ends,
    another to join it, on the event loop: under a burst on busy cores those starts held up
    the loop, and with it the streams' connections.

    And a sync view runs as a WSGI server runs it: the `request_started` signal, Django's
    middleware chain in its sync mode and the view, in one hop to the turn's thread
    (`SyncViewHandler`), not a hop for the signal, then one between thread and loop for each
    middleware before the view and after it (about half the web's CPU of a chat post went to
    those hops).

    Async views pass the gate, to Django's own ASGI handler (`app`): the API's completions,
    which hold what they admit until their answer ends (a bound on them would be a bound on
    answers in flight). They share a ring of four long-lived threads for their thread-sensitive
    calls, so that no thread is started for them either."""

    def __init__(self, app: ASGI3Application, sync_app: ASGI3Application) -> None:
        self.app = app
        self.sync_app = sync_app
        # asyncio primitives belong to one event loop: daphne runs one, tests several.
        self._turns: WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Queue[ThreadPoolExecutor]] = (
            WeakKeyDictionary()
        )
        self._async_threads: WeakKeyDictionary[asyncio.AbstractEventLoop, Iterator[ThreadPoolExecutor]] = (
            WeakKeyDictionary()
        )

    def _free_turns(self) -> asyncio.Queue[ThreadPoolExecutor]:
        loop = asyncio.get_running_loop()
        turns = self._turns.get(loop)
        if turns is None:
            turns = self._turns[loop] = asyncio.Queue()
            for n in range(settings.WEB_SYNC_VIEWS_MAX):
                turns.put_nowait(ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sync-view-{n}"))
        return turns

    def _async_view_thread(self) -> ThreadPoolExecutor:
        loop = asyncio.get_running_loop()
        ring = self._async_threads.get(loop)
        if ring is None:
            ring = self._async_threads[loop] = itertools.cycle(
                [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"async-view-{n}") for n in range(4)]
            )
        return next(ring)

    async def __call__(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if not _view_is_sync(scope):
            async with ThreadSensitiveContext(executor=self._async_view_thread()):
                return await self.app(scope, receive, send)
        turns = self._free_turns()
        try:
            async with asyncio.timeout(settings.WEB_SYNC_VIEW_WAIT_S):
                executor = await turns.get()
        except TimeoutError:
            logger.warning(
                "busy, refused %s %s: no turn for a sync view in time", scope["method"], scope["path"]
            )
            await _send(_busy_response("server_busy"), send)
            return
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.sync_app(scope, receive, send)
        finally:
            turns.put_nowait(executor)


class SyncViewHandler(ASGIHandler):
    """Django's ASGI handler serving a sync view as a WSGI server does: the `request_started`
    signal, the request, the whole middleware chain (loaded in sync mode) and the view in one
    hop to the request's thread-sensitive thread (SyncViewGate lends it); the response is sent
    from the event loop, then closed (`request_finished`) in one more hop. Django's own handler
    makes a hop for the signal before the one for the view, and runs the view beside a task that
    listens for the client leaving, which cannot stop a sync view anyway. For sync views only: an
    async view would be run to its end in that thread."""

    def __init__(self) -> None:
        base.BaseHandler.__init__(self)
        self.load_middleware(is_async=False)

    async def handle(self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        try:
            response = await sync_to_async(self._respond, thread_sensitive=True)(scope, body_file)
            try:
                await self.send_response(response, send)
            finally:
                await sync_to_async(response.close, thread_sensitive=True)()
        finally:
            body_file.close()

    def _respond(self, scope: Scope, body_file: IO[bytes]) -> HttpResponseBase:
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            return error_response
        return self.get_response(request)


async def _send(response: HttpResponse, send: ASGISendCallable) -> None:
    headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in response.items()]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})


class DatabaseBusyMiddleware(MiddlewareMixin):
    """A request that waited past the database's lock timeout (SQLite) or the connection pool's
    timeout (PostgreSQL) is refused with 503 and Retry-After, like any other overload, not
    answered 500: its transaction rolled back, so nothing of it stays behind and the client can
    simply send it again."""

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError):
            return None
        logger.warning("database busy, refused %s %s: %s", request.method, request.path, exception)
        return _busy_response("database_busy")


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """CONTENT_SECURITY_POLICY on every response that has none of its own."""

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if settings.CONTENT_SECURITY_POLICY and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = settings.CONTENT_SECURITY_POLICY
        return response
