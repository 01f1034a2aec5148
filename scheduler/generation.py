"""The generation contract, owned here: the job a request puts on a queue, the events a worker
writes to the request's result stream, and the one fold every reader applies to those events.
The request's record (scheduler.models.Generation) is written by scheduler.services.

Everything that crosses a process boundary has one encoder and one decoder in this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from django.conf import settings


class Tier(StrEnum):
    """Service tiers, in claim order: VIP first, batch last."""

    VIP = "vip"
    NORMAL = "normal"
    BATCH = "batch"

    @property
    def label(self) -> str:
        return "VIP" if self is Tier.VIP else self.value.capitalize()


class Origin(StrEnum):
    """Which door a request came in by."""

    CHAT = "chat"
    API = "api"
    BATCH = "batch"

    @property
    def label(self) -> str:
        return "API" if self is Origin.API else self.value.capitalize()


# --- the job -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample the answer; the engine applies these and nothing else."""

    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...] = ()

    @classmethod
    def defaults(cls) -> SamplingParams:
        return cls(
            max_tokens=settings.GENERATION_MAX_TOKENS,
            temperature=settings.GENERATION_TEMPERATURE,
            top_p=settings.GENERATION_TOP_P,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "stop": list(self.stop)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        return cls(
            max_tokens=int(data["max_tokens"]),
            temperature=float(data["temperature"]),
            top_p=float(data["top_p"]),
            stop=tuple(data.get("stop") or ()),
        )


@dataclass(frozen=True, slots=True)
class GenerationJob:
    """One generation request as it waits in a queue. The queue entry adds when it was enqueued
    and its deadline (`max_wait_s` later, by Redis's clock): see scheduler.queues.Job.

    The prompt is either `messages`, rendered with the model's chat template, or `prompt`, a raw
    text the model continues as it is (a text completion); `messages` is empty then."""

    request_id: str
    origin: Origin
    messages: list[dict[str, str]]  # OpenAI-style [{"role": ..., "content": ...}]
    sampling: SamplingParams
    client_id: str  # whose concurrency limit the request counts against
    tier: Tier
    variant: str
    # How long the request may go unwatched before the worker cancels it; None: never (batch).
    disconnect_grace_s: float | None
    prompt: str | None = None

    def encode(self) -> str:
        return json.dumps(
            {
                "request_id": self.request_id,
                "origin": str(self.origin),
                "messages": self.messages,
                "sampling": self.sampling.to_dict(),
                "client_id": self.client_id,
                "tier": str(self.tier),
                "variant": self.variant,
                "disconnect_grace_s": self.disconnect_grace_s,
                "prompt": self.prompt,
            }
        )

    @classmethod
    def decode(cls, raw: str) -> GenerationJob:
        data = json.loads(raw)
        return cls(
            request_id=data["request_id"],
            origin=Origin(data["origin"]),
            messages=data["messages"],
            sampling=SamplingParams.from_dict(data["sampling"]),
            client_id=data["client_id"],
            tier=Tier(data["tier"]),
            variant=data["variant"],
            disconnect_grace_s=data["disconnect_grace_s"],
            prompt=data.get("prompt"),
        )


# --- result events -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Timings:
    """The worker's measurements of one answer, in ms."""

    queue_ms: float
    ttft_ms: float | None  # None: no token was written
    duration_ms: float
    engine: str


@dataclass(frozen=True, slots=True)
class Queued:
    type: ClassVar[str] = "queued"
    seq: int
    tier: Tier


@dataclass(frozen=True, slots=True)
class Start:
    type: ClassVar[str] = "start"
    worker: str
    variant: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Token:
    type: ClassVar[str] = "token"
    seq: int
    text: str


@dataclass(frozen=True, slots=True)
class Reset:
    """A worker died or drained mid-answer: the answer starts over."""

    type: ClassVar[str] = "reset"
    reason: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Done:
    """The answer ended normally; `finish_reason` "cancelled" when it was stopped."""

    type: ClassVar[str] = "done"
    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    timings: Timings | None = None


@dataclass(frozen=True, slots=True)
class Error:
    type: ClassVar[str] = "error"
    code: str
    message: str


EventBody = Queued | Start | Token | Reset | Done | Error
TERMINAL_EVENTS = frozenset({Done.type, Error.type})


def event_data(body: EventBody) -> dict[str, Any]:
    """An event's fields as sent on the wire (the result stream's `data`, the SSE `data`)."""
    if isinstance(body, Token):  # the per-token path: no asdict
        return {"seq": body.seq, "text": body.text}
    if isinstance(body, Done):
        return {
            "finish_reason": body.finish_reason,
            "usage": asdict(body.usage),
            "timings": asdict(body.timings) if body.timings is not None else {},
        }
    return asdict(body)


def event_encode(body: EventBody) -> tuple[str, str]:
    """(type, data) as a result stream entry holds them."""
    return body.type, json.dumps(event_data(body))


def event_decode(kind: str, data: dict[str, Any]) -> EventBody:
    """The inverse of event_data; raises ValueError for an unknown type."""
    if kind == Token.type:
        return Token(seq=int(data["seq"]), text=data["text"])
    if kind == Queued.type:
        return Queued(seq=int(data["seq"]), tier=Tier(data["tier"]))
    if kind == Start.type:
        return Start(
            worker=data.get("worker", ""),
            variant=data.get("variant", ""),
            attempt=int(data.get("attempt", 1)),
        )
    if kind == Reset.type:
        return Reset(reason=data.get("reason", ""), attempt=int(data.get("attempt", 0)))
    if kind == Done.type:
        timings = data.get("timings") or None
        return Done(
            finish_reason=data["finish_reason"],
            usage=Usage(**(data.get("usage") or {})),
            timings=Timings(**timings) if timings else None,
        )
    if kind == Error.type:
        return Error(code=data["code"], message=data["message"])
    raise ValueError(f"unknown result event type {kind!r}")


# --- the fold ------------------------------------------------------------------------------------


class AnswerFold:
    """An answer as its events tell it: the text written since the last reset, and how it
    ended. `unsent()` serves readers that pass the text on as it comes (a streamed reply)."""

    __slots__ = ("_parts", "_sent", "end", "restarted_after_sending")

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._sent = 0
        self.end: Done | Error | None = None
        # A reset came after some text was passed on, which cannot be taken back.
        self.restarted_after_sending = False

    def add(self, body: EventBody) -> None:
        if isinstance(body, Token):
            self._parts.append(body.text)
        elif isinstance(body, Reset):
            if self._sent:
                self.restarted_after_sending = True
            self._parts.clear()
            self._sent = 0
        elif isinstance(body, Done | Error):
            self.end = body

    def add_all(self, bodies: Iterable[EventBody]) -> AnswerFold:
        for body in bodies:
            self.add(body)
            if self.end is not None:
                break
        return self

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def finished(self) -> bool:
        return self.end is not None

    def unsent(self) -> str:
        """The text added since the last call."""
        new = "".join(self._parts[self._sent :])
        self._sent = len(self._parts)
        return new
