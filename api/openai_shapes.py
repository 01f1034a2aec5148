"""The OpenAI wire format: parse a chat or text completion request, shape responses, chunks and
errors.

Only what the scheduler can honour is accepted; a parameter that would change the answer and
that we cannot apply (n > 1, tools, logprobs, penalties...) is a 400 in OpenAI's error shape,
never silently ignored. Parameters that change nothing here (`user`, `metadata`...) are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from django.conf import settings
from django.http import JsonResponse

from api.models import BatchJob, BatchJobItem
from scheduler.admission import AdmissionRefused
from scheduler.generation import SamplingParams, Usage
from scheduler.key_limits import KeyLimitState, LimitLevel
from scheduler.prompt import ChatTemplateError, prompt_token_count, text_prompt_token_count

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOP_SEQUENCES = 4
# vLLM needs top_p above 0; 0 would mean "no token at all".
MIN_TOP_P = 1e-6
# Parameters we cannot apply, with the values that mean "not used".
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "seed": (None,),
    "audio": (None,),
    "prediction": (None,),
    "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]),
}


# A text completion's parameters beyond the chat ones that we cannot apply either.
_TEXT_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "logprobs": (None,),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "seed": (None,),
}
# OpenAI's and vLLM's default for a text completion (chat completions default to the model's room).
TEXT_COMPLETION_DEFAULT_MAX_TOKENS = 16


class ApiError(Exception):
    """An error response in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # OpenAI's field name
        code: str | None = None,
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


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated request. Its `model` is only checked: routing picks the variant that answers
    (stable or canary), and responses name the one that did."""

    messages: list[dict[str, str]]
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, stop=tuple(self.stop)
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for n, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise invalid("Only text content parts are supported.", f"{param}[{n}]")
            texts.append(part["text"])
        return "\n".join(texts)
    raise invalid("Message content must be a string or a list of text parts.", param)


def _messages(raw: Any, param: str) -> list[dict[str, str]]:
    limit = settings.API_MAX_MESSAGES
    if not isinstance(raw, list) or not 1 <= len(raw) <= limit:
        raise invalid(f"`messages` must be a list of 1 to {limit} messages.", param)
    messages = []
    for n, message in enumerate(raw):
        where = f"{param}[{n}]"
        if not isinstance(message, dict):
            raise invalid("Each message must be an object with `role` and `content`.", where)
        role = message.get("role")
        if not isinstance(role, str):
            raise invalid(f"`role` must be one of {', '.join(ROLES)}.", f"{where}.role")
        if role in {"tool", "function"} or message.get("tool_calls"):
            raise invalid("Tools (function calling) are not supported.", f"{where}.role")
        if role not in ROLES:
            raise invalid(f"Unknown role {role!r}; use one of {', '.join(ROLES)}.", f"{where}.role")
        messages.append(
            {"role": ROLES[role], "content": _content_text(message.get("content"), f"{where}.content")}
        )
    chars = sum(len(message["content"]) for message in messages)
    if chars > settings.API_MAX_PROMPT_CHARS:
        raise invalid(
            f"The messages hold {chars} characters; at most {settings.API_MAX_PROMPT_CHARS} are accepted.",
            param,
        )
    return messages


def _context_check(messages: list[dict[str, str]], max_tokens: int, param: str) -> None:
    """Refuse, before it is queued, a prompt that the model's context cannot hold with its answer."""
    try:
        prompt_tokens = prompt_token_count(messages, model_path=settings.INFERENCE_MODEL)
    except ChatTemplateError as exc:
        raise invalid(f"The model's chat template refused the messages: {exc}", param) from None
    context = settings.INFERENCE_MAX_MODEL_LEN
    if prompt_tokens + max_tokens > context:
        raise ApiError(
            400,
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in "
            "the completion). Please reduce the length of the messages or completion.",
            param=param,
            code="context_length_exceeded",
        )


def _max_tokens(data: dict[str, Any], param: str) -> int:
    name = "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
    value = data.get(name)
    if value is None:
        return settings.GENERATION_MAX_TOKENS
    limit = settings.INFERENCE_MAX_MODEL_LEN
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON has one number type: 64.0 is the integer 64
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
        raise invalid(f"`{name}` must be an integer from 1 to {limit}.", param + name)
    return value


def _bounded(data: dict[str, Any], name: str, default: float, low: float, high: float, param: str) -> float:
    value = data.get(name)
    if value is None:
        return default
    if not _is_number(value) or not low <= value <= high:
        raise invalid(f"`{name}` must be a number from {low} to {high}.", param + name)
    return float(value)


def _stop(raw: Any, param: str) -> list[str]:
    if raw is None:
        return []
    stops = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP_SEQUENCES
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise invalid(f"`stop` must be a string or a list of up to {MAX_STOP_SEQUENCES} strings.", param)
    return stops


def chat_request_parse(data: Any, *, param_prefix: str = "", allow_stream: bool = True) -> ChatRequest:
    """Validate a chat completion request body (already decoded JSON); raises ApiError(400)."""
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.", param_prefix.rstrip(".") or None)
    for name, unused in _UNSUPPORTED.items():
        if data.get(name) not in unused:
            raise invalid(f"`{name}` is not supported by this service.", param_prefix + name)
    if not isinstance(data.get("model"), str) or not data["model"]:
        raise invalid("`model` is required: one of the ids from GET /v1/models.", param_prefix + "model")
    stream = False if data.get("stream") is None else data["stream"]
    if not isinstance(stream, bool):
        raise invalid("`stream` must be a boolean.", param_prefix + "stream")
    if stream and not allow_stream:
        raise invalid("Requests in a job are answered whole: leave `stream` out.", param_prefix + "stream")
    stream_options = data.get("stream_options")
    if stream_options is not None and (not stream or not isinstance(stream_options, dict)):
        raise invalid(
            "`stream_options` is only allowed with `stream: true`.", param_prefix + "stream_options"
        )
    messages = _messages(data.get("messages"), param_prefix + "messages")
    max_tokens = _max_tokens(data, param_prefix)
    _context_check(messages, max_tokens, param_prefix + "messages")
    return ChatRequest(
        messages=messages,
        max_tokens=max_tokens,
        temperature=_bounded(data, "temperature", settings.GENERATION_TEMPERATURE, 0.0, 2.0, param_prefix),
        top_p=_bounded(data, "top_p", settings.GENERATION_TOP_P, MIN_TOP_P, 1.0, param_prefix),
        stop=_stop(data.get("stop"), param_prefix + "stop"),
        stream=stream,
        include_usage=bool((stream_options or {}).get("include_usage")),
    )


# --- text completions (/v1/completions) -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextCompletionRequest:
    """A validated legacy completion: a raw prompt the model continues, with no chat template."""

    prompt: str
    prompt_tokens: int  # as the model's tokenizer counts them (a bound without one)
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, stop=tuple(self.stop)
        )


def _text_prompt(raw: Any) -> str:
    """A string, or a list holding one string; token ids and several prompts are refused."""
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
        raw = raw[0]
    if isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
        raise invalid("Send one prompt per request: `prompt` may be a list of one string only.", "prompt")
    if isinstance(raw, list) and raw and all(isinstance(p, int | list) for p in raw):
        raise invalid("Token ids are not accepted as `prompt`: send the prompt's text.", "prompt")
    if not isinstance(raw, str) or not raw:
        raise invalid("`prompt` is required: a non-empty string.", "prompt")
    if len(raw) > settings.API_MAX_PROMPT_CHARS:
        raise invalid(
            f"The prompt holds {len(raw)} characters; at most {settings.API_MAX_PROMPT_CHARS} are accepted.",
            "prompt",
        )
    return raw


def text_completion_request_parse(data: Any) -> TextCompletionRequest:
    """Validate a /v1/completions body (already decoded JSON); raises ApiError(400)."""
    if not isinstance(data, dict):
        raise invalid("The request body must be a JSON object.")
    for name, unused in (_UNSUPPORTED | _TEXT_UNSUPPORTED).items():
        if data.get(name) not in unused:
            raise invalid(f"`{name}` is not supported by this service.", name)
    if not isinstance(data.get("model"), str) or not data["model"]:
        raise invalid("`model` is required: one of the ids from GET /v1/models.", "model")
    stream = False if data.get("stream") is None else data["stream"]
    if not isinstance(stream, bool):
        raise invalid("`stream` must be a boolean.", "stream")
    stream_options = data.get("stream_options")
    if stream_options is not None and (not stream or not isinstance(stream_options, dict)):
        raise invalid("`stream_options` is only allowed with `stream: true`.", "stream_options")
    prompt = _text_prompt(data.get("prompt"))
    max_tokens = (
        TEXT_COMPLETION_DEFAULT_MAX_TOKENS if data.get("max_tokens") is None else _max_tokens(data, "")
    )
    prompt_tokens = text_prompt_token_count(prompt, model_path=settings.INFERENCE_MODEL)
    context = settings.INFERENCE_MAX_MODEL_LEN
    if prompt_tokens + max_tokens > context:
        raise ApiError(
            400,
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in the "
            "completion). Please reduce the length of the prompt or completion.",
            param="prompt",
            code="context_length_exceeded",
        )
    return TextCompletionRequest(
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        temperature=_bounded(data, "temperature", settings.GENERATION_TEMPERATURE, 0.0, 2.0, ""),
        top_p=_bounded(data, "top_p", settings.GENERATION_TOP_P, MIN_TOP_P, 1.0, ""),
        stop=_stop(data.get("stop"), "stop"),
        stream=stream,
        include_usage=bool((stream_options or {}).get("include_usage")),
    )


# --- responses ------------------------------------------------------------------------------


def completion_id(request_id: str) -> str:
    return "chatcmpl-" + request_id.replace("-", "")


def usage_object(usage: Usage) -> dict[str, int]:
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_object(
    *,
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: Usage,
) -> dict[str, Any]:
    return {
        "id": completion_id(request_id),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage_object(usage),
    }


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """A chat completion's CompletionShape: what every chunk of one streamed answer repeats, and
    the whole answer."""

    request_id: str
    created: int
    model: str
    include_usage: bool

    def chunk(self, delta: dict[str, str] | None, finish_reason: str | None = None) -> dict[str, Any]:
        """A chunk with one choice, or with none (the closing usage chunk) when `delta` is None."""
        chunk: dict[str, Any] = {
            "id": completion_id(self.request_id),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": []
            if delta is None
            else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if self.include_usage:
            chunk["usage"] = None  # OpenAI: null on every chunk but the last
        return chunk

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return {**self.chunk(None), "usage": usage_object(usage)}

    # The CompletionShape of a chat completion.

    def opening_chunk(self) -> dict[str, Any] | None:
        return self.chunk({"role": "assistant", "content": ""})

    def text_chunk(self, text: str) -> dict[str, Any]:
        return self.chunk({"content": text})

    def closing_chunk(self, finish_reason: str) -> dict[str, Any]:
        return self.chunk({}, finish_reason)

    def whole(self, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        return completion_object(
            request_id=self.request_id,
            created=self.created,
            model=self.model,
            text=text,
            finish_reason=finish_reason,
            usage=usage,
        )


class CompletionShape(Protocol):
    """How one answer is written out, whole or as stream chunks: a chat or a text completion."""

    include_usage: bool

    def opening_chunk(self) -> dict[str, Any] | None: ...

    def text_chunk(self, text: str) -> dict[str, Any]: ...

    def closing_chunk(self, finish_reason: str) -> dict[str, Any]: ...

    def usage_chunk(self, usage: Usage) -> dict[str, Any]: ...

    def whole(self, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]: ...


def text_completion_id(request_id: str) -> str:
    return "cmpl-" + request_id.replace("-", "")


@dataclass(frozen=True, slots=True)
class TextCompletionShape:
    """A text completion (`object: text_completion`), whole or streamed: chunks are the same
    object with the new text; with `include_usage`, a last chunk with no choices holds usage."""

    request_id: str
    created: int
    model: str
    include_usage: bool

    def _object(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": text_completion_id(self.request_id),
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def _chunk(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        chunk = self._object([{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}])
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def opening_chunk(self) -> dict[str, Any] | None:
        return None  # no role to announce: the first chunk carries text

    def text_chunk(self, text: str) -> dict[str, Any]:
        return self._chunk(text, None)

    def closing_chunk(self, finish_reason: str) -> dict[str, Any]:
        return self._chunk("", finish_reason)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return {**self._object([]), "usage": usage_object(usage)}

    def whole(self, text: str, finish_reason: str, usage: Usage) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self._object([choice]), "usage": usage_object(usage)}


def model_list(models: dict[str, str]) -> dict[str, Any]:
    """`models`: variant -> the engines serving it."""
    return {"object": "list", "data": [model_object(variant, owner) for variant, owner in models.items()]}


def model_object(variant: str, engines: str) -> dict[str, Any]:
    # `created` is required by the SDKs; a variant has no creation time we could know.
    return {"id": variant, "object": "model", "created": 0, "owned_by": engines}


# --- jobs -------------------------------------------------------------------------------------


def job_requests_parse(data: Any) -> list[ChatRequest]:
    """`{"requests": [chat completion request, ...]}`; raises ApiError(400)."""
    limit = settings.BATCH_JOB_MAX_REQUESTS
    requests = data.get("requests") if isinstance(data, dict) else None
    if not isinstance(requests, list) or not 1 <= len(requests) <= limit:
        raise invalid(f"`requests` must be a list of 1 to {limit} chat completion requests.", "requests")
    return [
        chat_request_parse(request, param_prefix=f"requests[{n}].", allow_stream=False)
        for n, request in enumerate(requests)
    ]


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
            text=answer.text,
            finish_reason=answer.finish_reason,
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
