"""OpenAI's error shape (`ApiError`) and the errors the API answers with, and the parsing of
request bodies by the request models, whose refusals become 400s naming the parameter.

What vLLM's OpenAI server accepts is accepted with the same meaning, what it refuses is refused
with its text, and parameters it does not know are ignored (`api.openai_requests`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.conf import settings
from django.http import JsonResponse
from pydantic import ValidationError

from api.metrics import key_rate_limited_record
from api.models import ApiKey
from api.openai_requests import ChatCompletionRequest, CompletionRequest, RequestInvalid, SamplingRequest
from scheduler.admission import AdmissionRefused
from scheduler.prompt import ChatTemplateError, prompt_token_count, text_prompt_token_count

# An answer that expired in the queue met a long queue moments ago: give it time to drain.
EXPIRED_RETRY_AFTER_S = 10

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


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def model_not_found(model: str) -> ApiError:
    """vLLM's answer to a request naming a model it does not serve."""
    return ApiError(
        404, f"The model `{model}` does not exist.", type="NotFoundError", param="model", code=404
    )


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


def request_too_large(
    *, api_key: ApiKey, tokens: int, tokens_per_minute: int, param: str | None = None
) -> ApiError:
    """A request whose worst case exceeds its key's tokens per minute: it would never be admitted."""
    key_rate_limited_record(api_key=api_key, limit="tokens")
    return ApiError(
        429,
        f"Request too large: it may use {tokens} tokens (prompt and max_tokens, for every choice), over "
        f"this key's limit of {tokens_per_minute} tokens per minute. Lower max_tokens or n, or shorten "
        "the prompt.",
        type="tokens",
        code="rate_limit_exceeded",
        param=param,
        retryable=False,
    )


def generation_error(code: str, message: str) -> ApiError:
    """A request admitted but not answered. Only an expired one is worth retrying soon: the
    others (timeout, engine failure, cancelled) would most likely end the same way again."""
    if code == "expired":
        return ApiError(503, message, type="server_error", code=code, retry_after_s=EXPIRED_RETRY_AFTER_S)
    return ApiError(500, message, type="server_error", code=code, retryable=False)


# --- request bodies ---------------------------------------------------------------------------


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
