"""The OpenAI wire format: parse a chat or text completion request, shape responses, chunks and
errors.

Requests are parsed by the protocol's pydantic models (`api.openai_requests`), which follow
vLLM's OpenAI server: what it accepts is accepted with the same meaning, what it refuses is a
400 in OpenAI's error shape naming the parameter, and parameters it does not know are ignored.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.conf import settings
from django.http import JsonResponse
from pydantic import TypeAdapter, ValidationError

from api.models import BatchJob, BatchJobItem
from api.openai_requests import (
    ChatCompletionRequest,
    CompletionRequest,
    FunctionCall,
    NamedToolChoice,
    RequestInvalid,
    SamplingRequest,
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
from scheduler.admission import AdmissionRefused
from scheduler.generation import ParsedAnswer, ParsedDelta, TokenLogprob, Usage
from scheduler.generation import ToolCallDelta as ParsedToolCallDelta
from scheduler.key_limits import KeyLimitState, LimitLevel
from scheduler.prompt import ChatTemplateError, prompt_token_count, text_prompt_token_count

SamplingRequestT = TypeVar("SamplingRequestT", bound=SamplingRequest)


class ApiError(Exception):
    """An error response in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # OpenAI's field name
        code: str | int | None = None,  # vLLM's errors carry their status here
        param: str | None = None,
        retry_after_s: int | None = None,
        retryable: bool | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s
        self.retryable = retryable
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status, headers=self.headers)
        if self.retry_after_s is not None:
            response["Retry-After"] = str(self.retry_after_s)
        if self.status == 401:
            response["WWW-Authenticate"] = "Bearer"
        if self.retryable is not None:
            # OpenAI's SDKs obey this over their own retry rules (which retry every 5xx).
            response["x-should-retry"] = "true" if self.retryable else "false"
        return response


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


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def api_error_for_refusal(refusal: AdmissionRefused, headers: dict[str, str] | None = None) -> ApiError:
    """`headers`: the key's x-ratelimit-* headers, when it has limits of its own."""
    if refusal.status == 429:
        tokens = refusal.reason == "rate_limited_key_tokens"
        message = refusal.message
        if refusal.reason in {"rate_limited_key_requests", "rate_limited_key_tokens"}:
            per_minute = "tokens per minute (TPM)" if tokens else "requests per minute (RPM)"
            message = (
                f"Rate limit reached for {per_minute} on this API key. "
                f"Please try again in {refusal.retry_after_s}s."
            )
        return ApiError(
            429,
            message,
            type="tokens" if tokens else "requests",
            code="rate_limit_exceeded",
            retry_after_s=refusal.retry_after_s,
            headers=headers,
        )
    return ApiError(
        refusal.status,
        refusal.message,
        type="server_error",
        code=refusal.reason,
        retry_after_s=refusal.retry_after_s,
        headers=headers,
    )


# Steps of a pydantic error location that name a branch of a union or a validator, not a field
# (as vLLM's server drops them from `param`).
_LOCATION_MARKERS = frozenset(
    {"str", "int", "float", "bool", "list", "dict", "none", "union", "tagged-union"}
)


def _param(location: tuple[int | str, ...], prefix: str) -> str | None:
    """A pydantic error location as OpenAI names a parameter: `messages[0].content`."""
    param = ""
    for part in location:
        if isinstance(part, int):
            param += f"[{part}]"
        elif not (
            part in _LOCATION_MARKERS
            or part.startswith("constrained-")
            or part[:1].isupper()  # a model's name: the branch of a union
            or any(c in part for c in "[](){}")
        ):
            param += f".{part}" if param else part
    return prefix + param if param else prefix.rstrip(".") or None


def _validation_error(exc: ValidationError, prefix: str) -> ApiError:
    error = exc.errors()[0]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, RequestInvalid):
        param = prefix + cause.param if cause.param else _param(error["loc"], prefix)
        return invalid(cause.message, param)
    param = _param(error["loc"], prefix)
    if error["type"] == "missing":
        return invalid(f"`{param}` is required.", param)
    return invalid(f"Invalid value for `{param}`: {error['msg']}.", param)


def _context_check(prompt_tokens: int, max_tokens: int, *, param: str, prompt_name: str) -> None:
    """Refuse, before it is queued, a prompt that the model's context cannot hold with its answer."""
    context = settings.INFERENCE_MAX_MODEL_LEN
    if prompt_tokens + max_tokens > context:
        raise ApiError(
            400,
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {prompt_name}, {max_tokens} in "
            f"the completion). Please reduce the length of the {prompt_name} or completion.",
            param=param,
            code="context_length_exceeded",
        )


def _parsed(model: type[SamplingRequestT], data: Any, param_prefix: str) -> SamplingRequestT:
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.", param_prefix.rstrip(".") or None)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, param_prefix) from None


def model_not_found(model: str) -> ApiError:
    """vLLM's answer to a request naming a model it does not serve."""
    return ApiError(
        404, f"The model `{model}` does not exist.", type="NotFoundError", param="model", code=404
    )


def chat_request_parse(data: Any, *, param_prefix: str = "", in_job: bool = False) -> ChatCompletionRequest:
    """Validate a chat completion request body (already decoded JSON); raises ApiError(400).
    A job's requests are answered whole, one choice each, from the stored answer's text."""
    request = _parsed(ChatCompletionRequest, data, param_prefix)
    if in_job:
        for name, used in (
            ("stream", request.stream),
            ("n", request.choices > 1),
            ("logprobs", request.logprobs),
            ("tool_choice", request.tool_choice not in (None, "none")),
        ):
            if used:
                raise invalid(f"`{name}` is not available for requests in a job.", param_prefix + name)
    param = param_prefix + "messages"
    try:
        prompt_tokens = prompt_token_count(request.prompt_messages(), model_path=settings.INFERENCE_MODEL)
    except ChatTemplateError as exc:
        raise invalid(f"The model's chat template refused the messages: {exc}", param) from None
    _context_check(prompt_tokens, request.answer_max_tokens, param=param, prompt_name="messages")
    return request


def text_completion_request_parse(data: Any) -> CompletionRequest:
    """Validate a /v1/completions body (already decoded JSON); raises ApiError(400)."""
    request = _parsed(CompletionRequest, data, "")
    prompt_tokens = text_prompt_token_count(request.prompt_text, model_path=settings.INFERENCE_MODEL)
    _context_check(prompt_tokens, request.answer_max_tokens, param="prompt", prompt_name="prompt")
    return request


# --- responses ------------------------------------------------------------------------------


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


# --- jobs -------------------------------------------------------------------------------------


def job_requests_parse(data: Any) -> list[ChatCompletionRequest]:
    """`{"requests": [chat completion request, ...]}`; raises ApiError(400)."""
    limit = settings.BATCH_JOB_MAX_REQUESTS
    requests = data.get("requests") if isinstance(data, dict) else None
    if not isinstance(requests, list) or not 1 <= len(requests) <= limit:
        raise invalid(f"`requests` must be a list of 1 to {limit} chat completion requests.", "requests")
    # A job's requests are stored, and PostgreSQL stores no NUL character.
    for n, request in enumerate(requests):
        if _has_nul(request):
            raise invalid("A stored request cannot contain NUL characters.", f"requests[{n}]")
    return [
        chat_request_parse(request, param_prefix=f"requests[{n}].", in_job=True)
        for n, request in enumerate(requests)
    ]


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(key) or _has_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False


def _timestamp(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def _item_result(item: BatchJobItem) -> dict[str, Any]:
    result: dict[str, Any] = {"index": item.index, "status": item.status, "response": None, "error": None}
    if item.status == BatchJobItem.Status.COMPLETED:
        answer = item.generation
        result["response"] = completion_object(
            request_id=str(item.generation_id),
            created=_timestamp(answer.finished_at) or 0,
            model=answer.variant,
            choices=[ChoiceOutcome(text=answer.text, finish_reason=answer.finish_reason)],
            usage=Usage(answer.prompt_tokens or 0, answer.completion_tokens or 0),
        )
    elif item.status == BatchJobItem.Status.FAILED:
        answer = item.generation
        result["error"] = {"code": answer.error_code, "message": answer.error_message}
    elif item.status == BatchJobItem.Status.CANCELLED and item.job.status == BatchJob.Status.KEY_REVOKED:
        result["error"] = {
            "code": "key_revoked",
            "message": "The job's API key was revoked before this request was answered.",
        }
    elif item.status == BatchJobItem.Status.CANCELLED:
        result["error"] = {
            "code": "cancelled",
            "message": "The job was cancelled before this request was answered.",
        }
    return result


def job_object(
    job: BatchJob, progress: dict[str, int], items: Iterable[BatchJobItem] | None = None
) -> dict[str, Any]:
    """The job as the API shows it; `results` (one per request, in order) when items are given."""
    body: dict[str, Any] = {
        "id": str(job.pk),
        "object": "job",
        "status": job.status,
        "created_at": _timestamp(job.created_at),
        "started_at": _timestamp(job.started_at),
        "finished_at": _timestamp(job.finished_at),
        "progress": progress,
    }
    if items is not None:
        body["results"] = [_item_result(item) for item in items]
    return body
