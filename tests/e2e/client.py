"""A browser-like HTTP client for end-to-end tests: session cookies, CSRF, SSE parsing."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

from launcher.process import ROOT
from scheduler.generation import TERMINAL_EVENTS, AnswerFold, event_decode


def static_links(page: str) -> list[str]:
    """The /static/ URLs of the stylesheets and scripts a page loads."""
    return re.findall(r'<(?:link|script)\b[^>]*\b(?:href|src)="(/static/[^"]+)"', page)


def chat_page_assets_check(base_url: str) -> None:
    """The chat page, and every stylesheet and script it links, byte for byte the files in
    static/, as a browser loads them from `base_url`."""
    with httpx.Client(base_url=base_url, timeout=10) as browser:
        page = browser.get("/")
        assert page.status_code == 200
        links = static_links(page.text)
        assert {"/static/chat/chat.css", "/static/chat/chat.js", "/static/vendor/htmx.min.js"} <= set(links)
        for link in links:
            response = browser.get(link)
            assert response.status_code == 200, link
            assert response.content == (ROOT / "static" / link.removeprefix("/static/")).read_bytes(), link


@dataclass
class SseEvent:
    event: str
    data: Any
    id: str | None


@dataclass
class StreamResult:
    events: list[SseEvent] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)

    @property
    def last_id(self) -> str | None:
        ids = [e.id for e in self.events if e.id]
        return ids[-1] if ids else None

    def of(self, kind: str) -> list[SseEvent]:
        return [e for e in self.events if e.event == kind]

    @property
    def text(self) -> str:
        """The answer as a browser shows it: tokens since the last reset."""
        answer = AnswerFold()
        for event in self.events:
            if event.event != "status":  # the relay's own; the rest are result events
                answer.add(event_decode(event.event, event.data))
        return answer.text

    @property
    def terminal(self) -> SseEvent | None:
        return next((e for e in self.events if e.event in TERMINAL_EVENTS), None)


class ChatClient:
    def __init__(self, base_url: str, timeout_s: float = 60.0) -> None:
        self.http = httpx.AsyncClient(base_url=base_url, timeout=timeout_s)
        self.timeout_s = timeout_s

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    @property
    def csrf(self) -> str:
        return self.http.cookies.get("csrftoken", "")

    async def open_page(self) -> str:
        """GET / as a browser does: returns the conversation id the page posts to."""
        response = await self.http.get("/")
        response.raise_for_status()
        match = re.search(r"/chat/([0-9a-f-]{36})/messages", response.text)
        assert match, "the chat page has no message form"
        return match.group(1)

    async def login(self, username: str, password: str) -> None:
        page = await self.http.get("/accounts/login/")
        page.raise_for_status()
        response = await self.http.post(
            "/accounts/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": self.csrf},
        )
        assert response.status_code == 302, f"login failed for {username}: {response.status_code}"

    async def new_conversation(self) -> str:
        if not self.csrf:
            await self.open_page()
        response = await self.http.post(
            "/chat/conversations", headers={"X-CSRFToken": self.csrf, "Accept": "application/json"}
        )
        assert response.status_code == 201, response.text
        return response.json()["id"]

    async def post_message(self, conversation_id: str, text: str) -> httpx.Response:
        return await self.http.post(
            f"/chat/{conversation_id}/messages",
            data={"text": text},
            headers={"X-CSRFToken": self.csrf, "Accept": "application/json"},
        )

    async def ask(self, conversation_id: str, text: str) -> str:
        response = await self.post_message(conversation_id, text)
        assert response.status_code == 202, f"{response.status_code}: {response.text}"
        return response.json()["request_id"]

    async def cancel(self, request_id: str) -> httpx.Response:
        return await self.http.post(f"/chat/requests/{request_id}/cancel", headers={"X-CSRFToken": self.csrf})

    async def stream(
        self,
        request_id: str,
        *,
        last_event_id: str | None = None,
        stop_after_tokens: int | None = None,
        stop_after_s: float | None = None,
    ) -> StreamResult:
        """Read the request's SSE stream until a terminal event, or drop the connection early."""
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        result = StreamResult()
        tokens = 0
        loop_started = _now()
        # Its own connection, as an EventSource has: leaving early really disconnects.
        async with (
            httpx.AsyncClient(
                base_url=self.http.base_url, cookies=self.http.cookies, timeout=self.timeout_s
            ) as http,
            http.stream("GET", f"/chat/stream/{request_id}", headers=headers) as response,
        ):
            assert response.status_code == 200, f"stream answered {response.status_code}"
            assert response.headers["content-type"].startswith("text/event-stream")
            fields: dict[str, str] = {}
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    result.comments.append(line[1:].strip())
                elif line == "":
                    if "event" in fields:
                        event = SseEvent(fields["event"], json.loads(fields["data"]), fields.get("id"))
                        result.events.append(event)
                        tokens += event.event == "token"
                        if event.event in TERMINAL_EVENTS:
                            break
                    fields = {}
                    if stop_after_tokens is not None and tokens >= stop_after_tokens:
                        break
                    if stop_after_s is not None and _now() - loop_started > stop_after_s:
                        break
                else:
                    name, _, value = line.partition(":")
                    fields[name] = value[1:] if value.startswith(" ") else value
        return result


def _now() -> float:
    import time

    return time.monotonic()
