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
    QUALITY = "quality"  # the quality score's questions (knowledge.quality)

    @property
    def label(self) -> str:
        return "API" if self is Origin.API else self.value.capitalize()


# --- the job -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on the answer's shape, applied by the engine while it samples (vLLM's
    structured outputs): one of valid JSON (`json_object`), JSON valid against `json_schema`,
    text matching `regex`, one of `choice`, or text of a `grammar` (EBNF or Lark)."""

    json_object: bool = False
    json_schema: dict[str, Any] | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "json_object": self.json_object,
            "json_schema": self.json_schema,
            "regex": self.regex,
            "choice": None if self.choice is None else list(self.choice),
            "grammar": self.grammar,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StructuredOutput:
        choice = data.get("choice")
        return cls(
            json_object=bool(data.get("json_object")),
            json_schema=data.get("json_schema"),
            regex=data.get("regex"),
            choice=None if choice is None else tuple(choice),
            grammar=data.get("grammar"),
        )


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample the answer and write out its text; the engine applies these and nothing
    else. Names, defaults and meanings are vLLM's `SamplingParams`."""

    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = 0  # 0: all tokens
    min_p: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    # How many most likely tokens to report beside each sampled one; None: no logprobs at all.
    logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    structured: StructuredOutput | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    bad_words: tuple[str, ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": list(self.stop),
            "seed": self.seed,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "min_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos,
            "stop_token_ids": list(self.stop_token_ids),
            "logprobs": self.logprobs,
            # JSON object keys are strings: token ids travel as text.
            "logit_bias": None
            if self.logit_bias is None
            else {str(k): v for k, v in self.logit_bias.items()},
            "structured": None if self.structured is None else self.structured.to_dict(),
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "bad_words": list(self.bad_words),
            "allowed_token_ids": None if self.allowed_token_ids is None else list(self.allowed_token_ids),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        """Absent keys take their defaults: batch items stored before a parameter existed still
        decode to what they meant."""
        logit_bias = data.get("logit_bias")
        structured = data.get("structured")
        allowed_token_ids = data.get("allowed_token_ids")
        return cls(
            max_tokens=int(data["max_tokens"]),
            temperature=float(data["temperature"]),
            top_p=float(data["top_p"]),
            stop=tuple(data.get("stop") or ()),
            seed=data.get("seed"),
            presence_penalty=float(data.get("presence_penalty", 0.0)),
            frequency_penalty=float(data.get("frequency_penalty", 0.0)),
            repetition_penalty=float(data.get("repetition_penalty", 1.0)),
            top_k=int(data.get("top_k", 0)),
            min_p=float(data.get("min_p", 0.0)),
            min_tokens=int(data.get("min_tokens", 0)),
            ignore_eos=bool(data.get("ignore_eos", False)),
            stop_token_ids=tuple(data.get("stop_token_ids") or ()),
            logprobs=data.get("logprobs"),
            logit_bias=None if logit_bias is None else {int(k): float(v) for k, v in logit_bias.items()},
            structured=None if structured is None else StructuredOutput.from_dict(structured),
            include_stop_str_in_output=bool(data.get("include_stop_str_in_output", False)),
            skip_special_tokens=bool(data.get("skip_special_tokens", True)),
            spaces_between_special_tokens=bool(data.get("spaces_between_special_tokens", True)),
            bad_words=tuple(data.get("bad_words") or ()),
            allowed_token_ids=None if allowed_token_ids is None else tuple(allowed_token_ids),
        )


@dataclass(frozen=True, slots=True)
class ToolParsing:
    """An answer in which the worker finds tool calls ("auto" tool choice): the name of vLLM's
    tool-call parser for the model (`vllm serve --tool-call-parser`), the request's `tools` in
    OpenAI's shape, and whether it may call several at once."""

    parser: str
    tools: list[dict[str, Any]]
    parallel_tool_calls: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"parser": self.parser, "tools": self.tools, "parallel_tool_calls": self.parallel_tool_calls}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolParsing:
        return cls(
            parser=data["parser"], tools=data["tools"], parallel_tool_calls=bool(data["parallel_tool_calls"])
        )


@dataclass(frozen=True, slots=True)
class GroundingSource:
    """An article an answer was given: its sentences as the help center states them
    (knowledge.chunking.passage_sentences)."""

    slug: str
    title: str
    sentences: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Grounding:
    """What an answer of the `verified` style is held to (knowledge.grounding): the worker
    shows each sentence of it only once its facts are found in `sources` (or in the customer's
    `question`), replaces one that fails with the help center's own sentence, and says
    `decline` when nothing of the answer holds."""

    question: str
    language: str
    sources: tuple[GroundingSource, ...]
    decline: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "language": self.language,
            "sources": [
                {"slug": source.slug, "title": source.title, "sentences": list(source.sentences)}
                for source in self.sources
            ],
            "decline": self.decline,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Grounding:
        return cls(
            question=data["question"],
            language=data["language"],
            sources=tuple(
                GroundingSource(
                    slug=source["slug"], title=source["title"], sentences=tuple(source["sentences"])
                )
                for source in data["sources"]
            ),
            decline=data["decline"],
        )


@dataclass(frozen=True, slots=True)
class GroundingReport:
    """What was checked in an answer, for its `done` event, its record and the console: the
    variant's answer `style` (generated, verified or extractive), the sentences checked, those
    that failed and were replaced by the help center's own or left out, and why the answer is
    the decline (`declined`, knowledge.declines's reason; "" when it is not one)."""

    style: str
    checked: int = 0
    replaced: int = 0
    dropped: int = 0
    declined: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroundingReport:
        return cls(
            style=data["style"],
            checked=int(data.get("checked", 0)),
            replaced=int(data.get("replaced", 0)),
            dropped=int(data.get("dropped", 0)),
            declined=data.get("declined", ""),
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
    variant: str  # which variant's prompt and sampling these are (recorded, counted per variant)
    model: str  # whose workers answer it: the variant's model, resolved when it was built
    # How long the request may go unwatched before the worker cancels it; None: never (batch).
    disconnect_grace_s: float | None
    prompt: str | None = None
    # Which of its call's `n` choices this is (an API call's; each is a job): the call's prompt
    # and request are counted once, with choice 0.
    choice: int = 0
    # The API key whose own limits (scheduler.key_limits) the request counts against, when it
    # is not `client_id`: a batch job's item counts against its owner's batch limits and its
    # key's requests and tokens per minute.
    key_client_id: str | None = None
    tool_parsing: ToolParsing | None = None
    grounding: Grounding | None = None  # a chat answer of the `verified` style
    # A chat turn's conversation: its next turn prefers the worker that answered this one, whose
    # prefix cache holds the conversation so far (scheduler.queues, "affinity").
    conversation_id: str | None = None

    @property
    def limits_client_id(self) -> str:
        """Whose own requests and tokens buckets (an API key's) the request is charged to."""
        return self.key_client_id or self.client_id

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
                "model": self.model,
                "disconnect_grace_s": self.disconnect_grace_s,
                "prompt": self.prompt,
                "choice": self.choice,
                "key_client_id": self.key_client_id,
                "tool_parsing": None if self.tool_parsing is None else self.tool_parsing.to_dict(),
                "grounding": None if self.grounding is None else self.grounding.to_dict(),
                "conversation_id": self.conversation_id,
            }
        )

    @classmethod
    def decode(cls, raw: str) -> GenerationJob:
        data = json.loads(raw)
        tool_parsing = data.get("tool_parsing")
        grounding = data.get("grounding")
        return cls(
            request_id=data["request_id"],
            origin=Origin(data["origin"]),
            messages=data["messages"],
            sampling=SamplingParams.from_dict(data["sampling"]),
            client_id=data["client_id"],
            tier=Tier(data["tier"]),
            variant=data["variant"],
            model=data["model"],
            disconnect_grace_s=data["disconnect_grace_s"],
            prompt=data.get("prompt"),
            choice=int(data.get("choice", 0)),
            key_client_id=data.get("key_client_id"),
            tool_parsing=None if tool_parsing is None else ToolParsing.from_dict(tool_parsing),
            grounding=None if grounding is None else Grounding.from_dict(grounding),
            conversation_id=data.get("conversation_id"),
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
class TopLogprob:
    """One candidate token at one position, as OpenAI's `top_logprobs` entries show it."""

    token: str
    logprob: float
    bytes: list[int] | None

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "logprob": self.logprob, "bytes": self.bytes}


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The sampled token at one position, its log probability and the most likely candidates
    (OpenAI's `logprobs.content` entry)."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: tuple[TopLogprob, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "logprob": self.logprob,
            "bytes": self.bytes,
            "top_logprobs": [top.to_dict() for top in self.top_logprobs],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenLogprob:
        return cls(
            token=data["token"],
            logprob=float(data["logprob"]),
            bytes=data.get("bytes"),
            top_logprobs=tuple(
                TopLogprob(token=top["token"], logprob=float(top["logprob"]), bytes=top.get("bytes"))
                for top in data.get("top_logprobs") or ()
            ),
        )


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call as a parser streams it (OpenAI's chunk shape): the call's place in
    the answer, and what this piece adds (the first piece names it)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedDelta:
    """What the tool-call parser made of one engine step's text: the content a client is sent
    (None: none yet, the parser holds the text back) and pieces of tool calls."""

    content: str | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"content": self.content, "tool_calls": [asdict(call) for call in self.tool_calls]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParsedDelta:
        return cls(
            content=data.get("content"),
            tool_calls=tuple(ToolCallDelta(**call) for call in data.get("tool_calls") or ()),
        )


@dataclass(frozen=True, slots=True)
class CalledTool:
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(frozen=True, slots=True)
class ParsedAnswer:
    """What the tool-call parser made of the whole answer: its content (None: only calls) and
    the tools it calls."""

    content: str | None
    tool_calls: tuple[CalledTool, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"content": self.content, "tool_calls": [asdict(call) for call in self.tool_calls]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParsedAnswer:
        return cls(
            content=data.get("content"),
            tool_calls=tuple(CalledTool(**call) for call in data.get("tool_calls") or ()),
        )


@dataclass(frozen=True, slots=True)
class Token:
    """Text from one engine step, or from several when they came faster than the worker could
    write them (scheduler.results.ResultPublisher joins them); `tokens`: the output tokens it
    holds; `logprobs` (one entry per token of the text) only when the request asked for them,
    `parsed` only when its answer is parsed for tool calls."""

    type: ClassVar[str] = "token"
    seq: int
    text: str
    tokens: int = 1
    logprobs: tuple[TokenLogprob, ...] | None = None
    parsed: ParsedDelta | None = None


@dataclass(frozen=True, slots=True)
class Reset:
    """A worker died or drained mid-answer: the answer starts over."""

    type: ClassVar[str] = "reset"
    reason: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Done:
    """The answer ended normally; `finish_reason` "cancelled" when it was stopped. `cached`:
    the answer came from the result cache (knowledge.cache), not from a worker. `parsed`: the
    whole answer as the tool-call parser read it, when it was parsed. `grounding`: what was
    checked in a chat answer, and whether it is the decline."""

    type: ClassVar[str] = "done"
    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    timings: Timings | None = None
    cached: bool = False
    parsed: ParsedAnswer | None = None
    grounding: GroundingReport | None = None


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
        data: dict[str, Any] = {"seq": body.seq, "text": body.text, "tokens": body.tokens}
        if body.logprobs is not None:
            data["logprobs"] = [entry.to_dict() for entry in body.logprobs]
        if body.parsed is not None:
            data["parsed"] = body.parsed.to_dict()
        return data
    if isinstance(body, Done):
        done: dict[str, Any] = {
            "finish_reason": body.finish_reason,
            "usage": asdict(body.usage),
            "timings": asdict(body.timings) if body.timings is not None else {},
            "cached": body.cached,
        }
        if body.parsed is not None:
            done["parsed"] = body.parsed.to_dict()
        if body.grounding is not None:
            done["grounding"] = body.grounding.to_dict()
        return done
    return asdict(body)


# Compact, because the SSE relay passes a token's stored data on as it is; and made once,
# because json.dumps builds a new encoder for every call that sets separators.
_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def event_encode(body: EventBody) -> tuple[str, str]:
    """(type, data) as a result stream entry holds them."""
    return body.type, _compact_json(event_data(body))


def event_decode(kind: str, data: dict[str, Any]) -> EventBody:
    """The inverse of event_data; raises ValueError for an unknown type."""
    if kind == Token.type:
        logprobs = data.get("logprobs")
        parsed = data.get("parsed")
        return Token(
            seq=int(data["seq"]),
            text=data["text"],
            # An event stored before tokens were counted: one a step.
            tokens=int(data.get("tokens", 1)),
            logprobs=None if logprobs is None else tuple(TokenLogprob.from_dict(entry) for entry in logprobs),
            parsed=None if parsed is None else ParsedDelta.from_dict(parsed),
        )
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
        parsed_answer = data.get("parsed")
        grounding = data.get("grounding")
        return Done(
            finish_reason=data["finish_reason"],
            usage=Usage(**(data.get("usage") or {})),
            timings=Timings(**timings) if timings else None,
            cached=bool(data.get("cached", False)),
            parsed=None if parsed_answer is None else ParsedAnswer.from_dict(parsed_answer),
            grounding=None if grounding is None else GroundingReport.from_dict(grounding),
        )
    if kind == Error.type:
        return Error(code=data["code"], message=data["message"])
    raise ValueError(f"unknown result event type {kind!r}")


# --- the fold ------------------------------------------------------------------------------------


class AnswerFold:
    """An answer as its events tell it: the tokens written since the last reset, and how it
    ended. `unsent()` serves readers that pass the text on as it comes (a streamed reply).

    Tokens are numbered (`seq`) from 0 after each reset: a token whose number the answer
    already has is a repeat and is dropped, and one past the next number leaves a gap. Both
    are counted (`repeated`, `skipped`), so that tests and benchmarks that break streams on
    purpose can tell that a resumed stream lost nothing and repeated nothing."""

    __slots__ = (
        "_next_seq",
        "_parts",
        "_sent",
        "end",
        "repeated",
        "resets",
        "restarted_after_sending",
        "skipped",
    )

    def __init__(self) -> None:
        self._parts: list[Token] = []
        # The number the next token should carry: one past the highest seen since the reset
        # (not the count of tokens kept, which a gap leaves behind).
        self._next_seq = 0
        self._sent = 0
        self.end: Done | Error | None = None
        # A reset came after some text was passed on, which cannot be taken back.
        self.restarted_after_sending = False
        self.repeated = 0
        self.skipped = 0
        self.resets = 0

    def add(self, body: EventBody) -> None:
        if isinstance(body, Token):
            if body.seq < self._next_seq:
                self.repeated += 1
                return
            self.skipped += body.seq - self._next_seq
            self._next_seq = body.seq + 1
            self._parts.append(body)
        elif isinstance(body, Reset):
            if self._sent:
                self.restarted_after_sending = True
            self._parts.clear()
            self._next_seq = 0
            self._sent = 0
            self.resets += 1
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
        return "".join(part.text for part in self._parts)

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        """Every token's logprobs, in order; None when the answer carries none."""
        return tokens_logprobs(self._parts)

    @property
    def finished(self) -> bool:
        return self.end is not None

    @property
    def has_tokens(self) -> bool:
        """Some of the answer has been written (since the last reset)."""
        return bool(self._parts)

    def unsent_tokens(self) -> list[Token]:
        """The token events added since the last call."""
        new = self._parts[self._sent :]
        self._sent = len(self._parts)
        return new

    def unsent(self) -> str:
        """The text added since the last call."""
        return "".join(part.text for part in self.unsent_tokens())


def tokens_logprobs(tokens: list[Token]) -> list[TokenLogprob] | None:
    if not any(token.logprobs is not None for token in tokens):
        return None
    return [entry for token in tokens for entry in token.logprobs or ()]
