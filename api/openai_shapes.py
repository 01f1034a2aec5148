"""Build OpenAI's responses from what the generations gave: chat and text completions whole and
as stream chunks, their logprobs, tool calls and their deltas, models, and x-ratelimit-* headers.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from api.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    FunctionCall,
    NamedToolChoice,
    ToolCall,
)
from api.openai_responses import AssistantMessage as AssistantMessageShape
from api.openai_responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    CompletionLogprobs,
    FunctionCallDelta,
    TextChoice,
    TextCompletion,
    TextCompletionChunk,
    ToolCallDelta,
)
from api.openai_responses import TokenLogprob as TokenLogprobShape
from api.openai_responses import Usage as UsageShape
from scheduler.generation import ParsedAnswer, ParsedDelta, TokenLogprob, Usage
from scheduler.generation import ToolCallDelta as ParsedToolCallDelta
from scheduler.key_limits import KeyLimitState, LimitLevel


def ratelimit_duration(seconds: float) -> str:
    """A wait as OpenAI's x-ratelimit-reset-* headers write it: "20ms", "1.5s", "6m0s", "1h2m3s"."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{round(secs, 3):g}s"
    if hours or minutes:
        text = f"{int(minutes)}m{int(secs)}s"
    return f"{int(hours)}h{text}" if hours else text


def ratelimit_headers(state: KeyLimitState) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers for the limits the key has."""
    headers: dict[str, str] = {}
    for kind, level in (("requests", state.requests), ("tokens", state.tokens)):
        if level is not None:
            headers |= _ratelimit_trio(kind, level)
    return headers


def _ratelimit_trio(kind: str, level: LimitLevel) -> dict[str, str]:
    return {
        f"x-ratelimit-limit-{kind}": str(level.limit),
        f"x-ratelimit-remaining-{kind}": str(level.remaining),
        f"x-ratelimit-reset-{kind}": ratelimit_duration(level.reset_s),
    }


def completion_id(request_id: str) -> str:
    return "chatcmpl-" + request_id.replace("-", "")


def usage_object(usage: Usage) -> dict[str, int]:
    return _usage_shape(usage).model_dump()


def _usage_shape(usage: Usage) -> UsageShape:
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    return UsageShape(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"  # vLLM's form


@dataclass(frozen=True, slots=True)
class _CalledFunction:
    """One call of a "required" tool choice, as the structured output makes the model write it."""

    name: str
    parameters: dict[str, Any]


_CALLED_FUNCTIONS = TypeAdapter(list[_CalledFunction])


@dataclass(frozen=True, slots=True)
class ChoiceOutcome:
    """One choice as its generation ended; `parsed`: as its tool-call parser read it."""

    text: str
    finish_reason: str
    logprobs: list[TokenLogprob] | None = None
    parsed: ParsedAnswer | None = None


def logprobs_shape(entries: Iterable[TokenLogprob], top: int) -> ChoiceLogprobs:
    """A chat choice's logprobs: each token with the first `top` of its candidates (the sampled
    token first), as vLLM's chat server keeps them."""
    content = []
    for entry in entries:
        data = entry.to_dict()
        content.append(TokenLogprobShape.model_validate({**data, "top_logprobs": data["top_logprobs"][:top]}))
    return ChoiceLogprobs(content=content)


def text_logprobs_shape(
    entries: Iterable[TokenLogprob], top: int, text_offset: int = 0
) -> CompletionLogprobs:
    """A text choice's logprobs as vLLM's completions server writes them: the tokens, their
    logprobs, each one's candidates as {token: logprob} (the sampled token and `top` more) and
    where each token starts in the answer's text (counting on from `text_offset`, where the
    previous chunk's tokens ended)."""
    shape = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
    for entry in entries:
        shape.tokens.append(entry.token)
        shape.token_logprobs.append(entry.logprob)
        shape.top_logprobs.append({c.token: c.logprob for c in entry.top_logprobs[: top + 1]})
        shape.text_offset.append(text_offset)
        text_offset += len(entry.token)
    return shape


_JSON = json.JSONDecoder()
_WHITESPACE = re.compile(r"\s*")


def _written_parameters(text: str) -> list[str | None]:
    """Each call's `parameters` as the model wrote them, whitespace kept, in a JSON list of
    {name, parameters} objects already known to be valid."""

    def skip(position: int) -> int:
        match = _WHITESPACE.match(text, position)
        assert match is not None  # \s* always matches
        return match.end()

    written: list[str | None] = []
    position = skip(skip(0) + 1)  # past "["
    while text[position : position + 1] == "{":
        position = skip(position + 1)
        parameters = None
        while text[position : position + 1] == '"':
            key, position = _JSON.raw_decode(text, position)
            start = skip(skip(position) + 1)  # past ":"
            _, position = _JSON.raw_decode(text, start)
            if key == "parameters":
                parameters = text[start:position]
            position = skip(position)
            if text[position : position + 1] == ",":
                position = skip(position + 1)
        written.append(parameters)
        position = skip(position + 1)  # past "}"
        if text[position : position + 1] == ",":
            position = skip(position + 1)
    return written


def required_tool_calls(text: str, *, as_written: bool = False) -> list[ToolCall]:
    """The calls in a "required" answer (a JSON list of {name, parameters}); none when the text
    is not such a list (cut short by max_tokens), as vLLM's server answers then. Arguments are
    the parameters re-encoded, as vLLM's whole answer gives them, or `as_written` by the model,
    as vLLM's stream gives them."""
    try:
        called = _CALLED_FUNCTIONS.validate_json(text)
    except ValidationError:
        return []
    written = _written_parameters(text) if as_written else [None] * len(called)
    return [
        ToolCall(
            id=tool_call_id(),
            function=FunctionCall(
                name=call.name,
                arguments=raw if raw is not None else json.dumps(call.parameters, ensure_ascii=False),
            ),
        )
        for call, raw in zip(called, written, strict=True)
    ]


def choice_object(index: int, outcome: ChoiceOutcome, request: ChatCompletionRequest | None) -> Choice:
    """A whole choice as vLLM's server writes it. A forced tool call (named or "required") is
    the answer's text parsed into `tool_calls`; "required" then finishes with "tool_calls"."""
    message = AssistantMessageShape(content=outcome.text)
    finish_reason = outcome.finish_reason
    choice = request.tool_choice if request is not None else None
    if isinstance(choice, NamedToolChoice):
        calls = (
            [
                ToolCall(
                    id=tool_call_id(),
                    function=FunctionCall(name=choice.function.name, arguments=outcome.text),
                )
            ]
            if outcome.text.strip()
            else []
        )
        message = AssistantMessageShape(content="", tool_calls=calls)
    elif choice == "required":
        message = AssistantMessageShape(content="", tool_calls=required_tool_calls(outcome.text))
        if finish_reason == "stop":
            finish_reason = "tool_calls"
    elif choice == "auto" and outcome.parsed is not None:
        # As vLLM's auto tool choice: the parser's content (None when only calls), and an
        # answer that calls tools finishes with "tool_calls", even one cut short.
        calls = [
            ToolCall(id=tool_call_id(), function=FunctionCall(name=call.name, arguments=call.arguments))
            for call in outcome.parsed.tool_calls
        ]
        message = AssistantMessageShape(content=outcome.parsed.content, tool_calls=calls)
        if calls:
            finish_reason = "tool_calls"
    logprobs = None
    if request is not None and request.logprobs:
        logprobs = logprobs_shape(outcome.logprobs or (), request.top_logprobs or 0)
    return Choice(index=index, message=message, logprobs=logprobs, finish_reason=finish_reason)


def completion_object(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[ChoiceOutcome],
    usage: Usage,
    request: ChatCompletionRequest | None = None,
) -> dict[str, Any]:
    """`request` None: a stored answer, text only (a job's)."""
    return ChatCompletion(
        id=completion_id(request_id),
        created=created,
        model=model,
        choices=[choice_object(index, outcome, request) for index, outcome in enumerate(choices)],
        usage=_usage_shape(usage),
    ).model_dump(mode="json")


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """What every chunk of one streamed completion repeats."""

    request_id: str
    created: int
    model: str
    include_usage: bool

    def chunk(
        self,
        delta: ChoiceDelta | None,
        finish_reason: str | None = None,
        *,
        index: int = 0,
        logprobs: ChoiceLogprobs | None = None,
    ) -> dict[str, Any]:
        """A chunk with one choice, or with none (the closing usage chunk) when `delta` is None.
        The delta holds only the fields it was given, as vLLM sends it."""
        chunk = ChatCompletionChunk(
            id=completion_id(self.request_id),
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            system_fingerprint=None,
            choices=[]
            if delta is None
            else [ChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason)],
        )
        if self.include_usage:
            chunk.usage = None  # OpenAI: null on every chunk but the last
        return chunk.model_dump(mode="json", exclude_unset=True)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return {**self.chunk(None), "usage": usage_object(usage)}


def text_completion_id(request_id: str) -> str:
    return "cmpl-" + request_id.replace("-", "")


def text_completion_object(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[ChoiceOutcome],
    usage: Usage,
    request: CompletionRequest,
) -> dict[str, Any]:
    """A whole text completion (`object: text_completion`)."""
    top = request.logprobs
    return TextCompletion(
        id=text_completion_id(request_id),
        created=created,
        model=model,
        choices=[
            TextChoice(
                index=index,
                text=outcome.text,
                logprobs=None if top is None else text_logprobs_shape(outcome.logprobs or (), top),
                finish_reason=outcome.finish_reason,
            )
            for index, outcome in enumerate(choices)
        ],
        usage=_usage_shape(usage),
    ).model_dump(mode="json")


@dataclass(frozen=True, slots=True)
class TextChunkHeader:
    """What every chunk of one streamed text completion repeats: chunks are text_completion
    objects with the new text; with `include_usage`, a last chunk with no choices holds usage."""

    request_id: str
    created: int
    model: str
    include_usage: bool

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        *,
        index: int = 0,
        logprobs: CompletionLogprobs | None = None,
    ) -> dict[str, Any]:
        """A chunk with one choice, or with none (the closing usage chunk) when `text` is None."""
        chunk = TextCompletionChunk(
            id=text_completion_id(self.request_id),
            object="text_completion",
            created=self.created,
            model=self.model,
            system_fingerprint=None,
            choices=[]
            if text is None
            else [TextChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish_reason)],
        )
        if self.include_usage:
            chunk.usage = None  # OpenAI: null on every chunk but the last
        return chunk.model_dump(mode="json", exclude_unset=True)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return {**self.chunk(None), "usage": usage_object(usage)}


def named_tool_call_delta(name: str | None, arguments: str) -> ChoiceDelta:
    """A named tool call's arguments as they stream; the first delta (`name` given) also carries
    the call's id, type and name (vLLM's extract_named_tool_call_streaming)."""
    if name is None:
        return ChoiceDelta(
            tool_calls=[ToolCallDelta(index=0, function=FunctionCallDelta(arguments=arguments))]
        )
    return ChoiceDelta(
        tool_calls=[
            ToolCallDelta(
                index=0,
                id=tool_call_id(),
                type="function",
                function=FunctionCallDelta(name=name, arguments=arguments),
            )
        ]
    )


def parsed_delta(parsed: ParsedDelta) -> ChoiceDelta | None:
    """What the tool-call parser let through of some text, as a chunk's delta (only the fields
    it set); None when it held everything back."""
    if parsed.content is None and not parsed.tool_calls:
        return None
    delta = ChoiceDelta()
    if parsed.content is not None:
        delta.content = parsed.content
    if parsed.tool_calls:
        delta.tool_calls = [_tool_call_piece(call) for call in parsed.tool_calls]
    return delta


def _tool_call_piece(call: ParsedToolCallDelta) -> ToolCallDelta:
    """A piece of a streamed call with the fields the parser gave (the first names the call)."""
    function = {name: value for name, value in (("name", call.name), ("arguments", call.arguments)) if value}
    piece = ToolCallDelta(index=call.index, function=FunctionCallDelta(**function))
    if call.id is not None:
        piece.id, piece.type = call.id, "function"
    return piece


def tool_calls_delta(calls: list[ToolCall]) -> ChoiceDelta:
    """A "required" answer's calls, whole, in one delta."""
    return ChoiceDelta(
        tool_calls=[
            ToolCallDelta(
                index=n,
                id=call.id,
                type="function",
                function=FunctionCallDelta(name=call.function.name, arguments=call.function.arguments),
            )
            for n, call in enumerate(calls)
        ]
    )


def model_list(models: dict[str, str]) -> dict[str, Any]:
    """`models`: variant -> the engines serving it."""
    return {"object": "list", "data": [model_object(variant, owner) for variant, owner in models.items()]}


def model_object(variant: str, engines: str) -> dict[str, Any]:
    # `created` is required by the SDKs; a variant has no creation time we could know.
    return {"id": variant, "object": "model", "created": 0, "owned_by": engines}
