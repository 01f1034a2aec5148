"""The OpenAI wire format: parse a chat completion request, shape responses, chunks and errors.

Only what the scheduler can honour is accepted; a parameter that would change the answer and
that we cannot apply (n > 1, tools, logprobs, penalties...) is a 400 in OpenAI's error shape,
never silently ignored. Parameters that change nothing here (`user`, `metadata`...) are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.http import JsonResponse

from api.models import BatchJob, BatchJobItem
from scheduler.admission import AdmissionRefused
from scheduler.generation import SamplingParams, Usage
from scheduler.prompt import ChatTemplateError, prompt_token_count

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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s
        self.retryable = retryable

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        if self.retry_after_s is not None:
            response["Retry-After"] = str(self.retry_after_s)
        if self.status == 401:
            response["WWW-Authenticate"] = "Bearer"
        if self.retryable is not None:
            # OpenAI's SDKs obey this over their own retry rules (which retry every 5xx).
            response["x-should-retry"] = "true" if self.retryable else "false"
        return response


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def api_error_for_refusal(refusal: AdmissionRefused) -> ApiError:
    if refusal.status == 429:
        return ApiError(
            429,
            refusal.message,
            type="requests",
            code="rate_limit_exceeded",
            retry_after_s=refusal.retry_after_s,
        )
    return ApiError(
        refusal.status,
        refusal.message,
        type="server_error",
        code=refusal.reason,
        retry_after_s=refusal.retry_after_s,
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
    """What every chunk of one streamed completion repeats."""

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
    parsed = [
        chat_request_parse(request, param_prefix=f"requests[{n}].", allow_stream=False)
        for n, request in enumerate(requests)
    ]
    # A job's requests are stored, and PostgreSQL stores no NUL character.
    for n, request in enumerate(parsed):
        if any("\x00" in text for text in [*(m["content"] for m in request.messages), *request.stop]):
            raise invalid("A stored request cannot contain NUL characters.", f"requests[{n}]")
    return parsed


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
