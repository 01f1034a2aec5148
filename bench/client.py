"""A lean browser-like client for load generation: HTTP/1.1 over asyncio streams.

httpx costs too much CPU per event to drive thousands of streams from one process on a small
machine; this client parses only what a browser's EventSource needs, and timestamps every
event as it arrives.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlencode, urlsplit

from scheduler.generation import TERMINAL_EVENTS, Done, Error, Usage, event_decode


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class StreamTrace:
    """What one SSE stream delivered, with arrival times (time.perf_counter): a time per token,
    so an event of several tokens (steps the worker wrote together) gives its time to each."""

    opened_at: float
    token_times: list[float] = field(default_factory=list)
    heartbeat_times: list[float] = field(default_factory=list)
    first_status_at: float | None = None
    outcome: str = "open"  # done | error:<code> | disconnected | timeout
    finish_reason: str | None = None
    closed_at: float | None = None
    queue_s: float | None = None  # the worker's count, from `done`: enqueued until it started
    # The worker's count, from `done`: its engine call until the first token (the prompt's
    # encoding included), what the engine alone is timed over.
    engine_ttft_s: float | None = None
    usage: Usage | None = None  # from `done`: the answer's prompt and answer tokens


class Session:
    """One browser: its cookies, CSRF token, and keep-alive connection for plain requests."""

    def __init__(self, base_url: str, *, forwarded_for: str | None = None) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        # The address a trusted proxy in front of the web would name (X-Forwarded-For): browsers
        # on other machines than the load generator's, each with its own address.
        self.forwarded_for = forwarded_for
        self.cookies: dict[str, str] = {}
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    @property
    def csrf(self) -> str:
        return self.cookies.get("csrftoken", "")

    def _head(self, method: str, path: str, extra: dict[str, str], body: bytes) -> bytes:
        headers = {"Host": f"{self.host}:{self.port}", "Connection": "keep-alive", **extra}
        if self.forwarded_for:
            headers["X-Forwarded-For"] = self.forwarded_for
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if body:
            headers["Content-Length"] = str(len(body))
        lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    def _remember_cookies(self, raw_headers: list[tuple[str, str]]) -> None:
        for name, value in raw_headers:
            if name == "set-cookie":
                cookie = SimpleCookie()
                cookie.load(value)
                for key, morsel in cookie.items():
                    self.cookies[key] = morsel.value

    async def request(
        self,
        method: str,
        path: str,
        *,
        form: dict[str, str] | None = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        body = urlencode(form).encode() if form is not None else b""
        extra = dict(headers or {})
        if form is not None:
            extra["Content-Type"] = "application/x-www-form-urlencoded"
        if json_body is not None:
            body = json.dumps(json_body).encode()
            extra["Content-Type"] = "application/json"
        for attempt in range(2):  # a kept-alive connection the server closed: reconnect once
            if self._conn is None:
                self._conn = await asyncio.open_connection(self.host, self.port)
            reader, writer = self._conn
            try:
                writer.write(self._head(method, path, extra, body))
                status, raw_headers = await _read_head(reader)
                length = int(dict(raw_headers).get("content-length", "0"))
                payload = await reader.readexactly(length) if length else b""
                if dict(raw_headers).get("transfer-encoding") == "chunked":
                    payload = b"".join([chunk async for chunk in _chunks(reader)])
                break
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:
                    raise
        self._remember_cookies(raw_headers)
        if dict(raw_headers).get("connection") == "close":
            self.close()
        return Response(status, dict(raw_headers), payload)

    def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None

    async def open_page(self) -> str:
        page = await self.request("GET", "/")
        match = re.search(rb"/chat/([0-9a-f-]{36})/messages", page.body)
        if page.status != 200 or match is None:
            raise RuntimeError(f"the chat page answered {page.status}")
        return match.group(1).decode()

    async def login(self, username: str, password: str) -> None:
        await self.request("GET", "/accounts/login/")
        response = await self.request(
            "POST",
            "/accounts/login/",
            form={"username": username, "password": password, "csrfmiddlewaretoken": self.csrf},
        )
        if response.status != 302:
            raise RuntimeError(f"login as {username} failed: {response.status}")

    async def new_conversation(self) -> str:
        response = await self.request(
            "POST", "/chat/conversations", headers={"X-CSRFToken": self.csrf, "Accept": "application/json"}
        )
        return response.json()["id"]

    async def post_message(self, conversation_id: str, text: str) -> Response:
        return await self.request(
            "POST",
            f"/chat/{conversation_id}/messages",
            form={"text": text},
            headers={"X-CSRFToken": self.csrf, "Accept": "application/json"},
        )

    async def stream(
        self,
        path: str,
        *,
        timeout_s: float,
        on_open: Callable[[], None] | None = None,
        on_first_status: Callable[[], None] | None = None,
        stop: asyncio.Event | None = None,
    ) -> StreamTrace:
        """Read an SSE stream on its own connection (as EventSource does) until it ends, the
        timeout passes, or `stop` is set (outcome "stopped")."""
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=2**20)
        trace = StreamTrace(opened_at=time.perf_counter())
        try:
            writer.write(self._head("GET", path, {"Accept": "text/event-stream"}, b""))
            status, _ = await _read_head(reader)
            if status != 200:
                trace.outcome = f"http:{status}"
                return trace
            if on_open is not None:
                on_open()
            async with asyncio.timeout(timeout_s):
                reading = asyncio.ensure_future(_read_events(reader, trace, on_first_status))
                if stop is None:
                    await reading
                else:
                    stopping = asyncio.ensure_future(stop.wait())
                    await asyncio.wait([reading, stopping], return_when=asyncio.FIRST_COMPLETED)
                    stopping.cancel()
                    if reading.done():
                        reading.result()
                    else:
                        reading.cancel()
                        trace.outcome = "stopped"
        except TimeoutError:
            trace.outcome = "timeout"
        except (ConnectionError, asyncio.IncompleteReadError):
            trace.outcome = "disconnected"
        finally:
            trace.closed_at = time.perf_counter()
            writer.close()
        return trace

    @asynccontextmanager
    async def sse(
        self, method: str, path: str, *, headers: dict[str, str], json_body: Any = None
    ) -> AsyncIterator[tuple[Response, AsyncIterator[SseEvent]]]:
        """One request on its own connection, as EventSource makes it. Yields the response (with
        the whole body unless it is a 200 event stream) and its events in order; heartbeat
        comments are skipped. Raises ConnectionError when the server is not there."""
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=2**20)
        try:
            body = json.dumps(json_body).encode() if json_body is not None else b""
            extra = {"Accept": "text/event-stream", **headers}
            if body:
                extra["Content-Type"] = "application/json"
            writer.write(self._head(method, path, extra, body))
            status, raw_headers = await _read_head(reader)
            response_headers = dict(raw_headers)
            if status != 200 or not response_headers.get("content-type", "").startswith("text/event-stream"):
                if response_headers.get("transfer-encoding") == "chunked":
                    payload = b"".join([chunk async for chunk in _chunks(reader)])
                else:
                    length = int(response_headers.get("content-length", "0"))
                    payload = await reader.readexactly(length) if length else b""
                yield Response(status, response_headers, payload), _no_events()
                return
            yield Response(status, response_headers, b""), _sse_blocks(reader)
        finally:
            writer.close()


@dataclass
class SseEvent:
    event: str  # "message" when the block names none (OpenAI's chunks)
    data: str
    id: str | None
    arrived_at: float


async def _no_events() -> AsyncIterator[SseEvent]:
    return
    yield


async def _sse_blocks(reader: asyncio.StreamReader) -> AsyncIterator[SseEvent]:
    buffer = b""
    async for chunk in _chunks(reader):
        now = time.perf_counter()
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            fields: dict[str, str] = {}
            for line in block.decode().split("\n"):
                name, _, value = line.partition(":")
                if name:  # a line starting with ":" is a comment
                    fields[name] = value.removeprefix(" ")
            if "data" in fields:
                yield SseEvent(fields.get("event", "message"), fields["data"], fields.get("id"), now)


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, list[tuple[str, str]]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = []
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers.append((name.strip().lower(), value.strip()))
    return status, headers


async def _chunks(reader: asyncio.StreamReader):
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return
        chunk = await reader.readexactly(size)
        await reader.readexactly(2)
        yield chunk


_TOKENS = re.compile(rb'"tokens":([0-9]+)')


def _tokens_in(data: bytes | None) -> int:
    """The tokens a token event holds (read without decoding the whole event); text that the
    model did not write (a help-center reply) counts as one, as a reader sees it arrive."""
    found = _TOKENS.search(data or b"")
    return max(1, int(found.group(1))) if found else 1


async def _read_events(
    reader: asyncio.StreamReader, trace: StreamTrace, on_first_status: Callable[[], None] | None
) -> None:
    buffer = b""
    async for chunk in _chunks(reader):
        now = time.perf_counter()
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            if block.startswith(b":"):
                trace.heartbeat_times.append(now)
                continue
            event = data = None
            for line in block.split(b"\n"):
                if line.startswith(b"event: "):
                    event = line[7:].decode()
                elif line.startswith(b"data: "):
                    data = line[6:]
            if event == "token":
                trace.token_times.extend([now] * _tokens_in(data))
            elif event == "status" and trace.first_status_at is None:
                trace.first_status_at = now
                if on_first_status is not None:
                    on_first_status()
            elif event in TERMINAL_EVENTS:
                end = event_decode(event, json.loads(data or b"{}"))
                trace.outcome = f"error:{end.code}" if isinstance(end, Error) else "done"
                if isinstance(end, Done):
                    trace.finish_reason = end.finish_reason
                    trace.usage = end.usage
                    if end.timings is not None:
                        trace.queue_s = end.timings.queue_ms / 1000
                        if end.timings.ttft_ms is not None:
                            trace.engine_ttft_s = end.timings.ttft_ms / 1000
                return
    trace.outcome = "closed"
