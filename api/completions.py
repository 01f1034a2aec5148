"""Chat and text completions for the OpenAI-compatible API: submit to the scheduler, then follow
the request's result stream and answer whole or as OpenAI chunks (a CompletionShape writes
either kind).

A `reset` event means a worker died and another restarts the answer from scratch. A whole
answer simply starts collecting again. A stream that has not sent any text yet carries on
with the new attempt; one that has cannot take its text back, so it ends with an error chunk
(code `generation_restarted`) and `[DONE]`, and the restarted generation is cancelled rather
than streamed to nobody. Clients retry such a call as they would any failed one.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from api.metrics import key_rate_limited_record
from api.models import ApiKey
from api.openai_shapes import (
    ApiError,
    ChatRequest,
    CompletionShape,
    TextCompletionRequest,
    completion_id,
    ratelimit_headers,
)
from chat.sse import sse_comment, sse_data
from scheduler import control
from scheduler.admission import AdmissionRefused, request_submit
from scheduler.generation import AnswerFold, Done, Error, GenerationJob, Origin, Tier
from scheduler.policy import tier_policy
from scheduler.prompt import prompt_token_count
from scheduler.results import result_follower
from scheduler.routing import variant_for
from scheduler.rules import answer_wait_limit_s

# An answer that expired in the queue met a long queue moments ago: give it time to drain.
EXPIRED_RETRY_AFTER_S = 10
# Admission's refusals for a key's own limits -> the limit, as the metrics name it.
KEY_LIMIT_REASONS = {"rate_limited_key_requests": "requests", "rate_limited_key_tokens": "tokens"}


@dataclass(frozen=True, slots=True)
class SubmittedCompletion:
    request_id: str
    variant: str
    created: int
    wait_limit_s: float  # the longest the caller waits for the end of the answer
    ratelimit_headers: dict[str, str]  # the key's x-ratelimit-* after this request; {} unlimited


def _tokens_at_most(request: ChatRequest | TextCompletionRequest) -> int:
    """The most tokens the request may use: its prompt and `max_tokens`."""
    if isinstance(request, TextCompletionRequest):
        prompt_tokens = request.prompt_tokens
    else:
        prompt_tokens = prompt_token_count(request.messages, model_path=settings.INFERENCE_MODEL)
    return prompt_tokens + request.max_tokens


def completion_submit(
    *, api_key: ApiKey, request: ChatRequest | TextCompletionRequest
) -> SubmittedCompletion:
    """Admit the request under the key's tier and limits; raises AdmissionRefused, or ApiError
    for a request larger than its key's tokens per minute (it would never be admitted)."""
    request_id = str(uuid.uuid4())
    variant = variant_for(conversation_id=completion_id(request_id))
    tier = Tier(api_key.effective_tier)
    text = isinstance(request, TextCompletionRequest)
    limits = api_key.limits
    tokens = _tokens_at_most(request) if limits.tokens_per_minute is not None else 0
    if limits.tokens_per_minute is not None and tokens > limits.tokens_per_minute:
        key_rate_limited_record(api_key=api_key, limit="tokens")
        raise ApiError(
            429,
            f"Request too large: it may use {tokens} tokens (prompt and max_tokens), over this key's "
            f"limit of {limits.tokens_per_minute} tokens per minute. Lower max_tokens or shorten the prompt.",
            type="tokens",
            code="rate_limit_exceeded",
            retryable=False,
        )
    try:
        admission = request_submit(
            job=GenerationJob(
                request_id=request_id,
                origin=Origin.API,
                messages=[] if text else request.messages,
                sampling=request.sampling_params(),
                client_id=api_key.client_id,
                tier=tier,
                variant=variant,
                disconnect_grace_s=settings.API_DISCONNECT_GRACE_S,
                prompt=request.prompt if text else None,
            ),
            limits=limits,
            tokens=tokens,
        )
    except AdmissionRefused as refusal:
        if refusal.reason in KEY_LIMIT_REASONS:
            key_rate_limited_record(api_key=api_key, limit=KEY_LIMIT_REASONS[refusal.reason])
        raise
    return SubmittedCompletion(
        request_id=request_id,
        variant=variant,
        created=int(time.time()),
        wait_limit_s=answer_wait_limit_s(tier_policy(tier).max_wait_s),
        ratelimit_headers=ratelimit_headers(admission.key_state) if admission.key_state else {},
    )


def generation_error(code: str, message: str) -> ApiError:
    """A request admitted but not answered. Only an expired one is worth retrying soon: the
    others (timeout, engine failure, cancelled) would most likely end the same way again."""
    if code == "expired":
        return ApiError(503, message, type="server_error", code=code, retry_after_s=EXPIRED_RETRY_AFTER_S)
    return ApiError(500, message, type="server_error", code=code, retryable=False)


def _cancelled() -> ApiError:
    return generation_error("cancelled", "The request was cancelled before its answer was finished.")


def _restarted() -> ApiError:
    return generation_error(
        "generation_restarted",
        "The server answering this request failed mid-answer; please send the request again.",
    )


def _wait_limit_error(submitted: SubmittedCompletion) -> ApiError:
    return generation_error("timeout", f"No complete answer within {submitted.wait_limit_s:.0f} s.")


async def _cancel(request_id: str) -> None:
    await sync_to_async(control.request_cancel, thread_sensitive=False)(request_id=request_id)


async def completion_collect(submitted: SubmittedCompletion, shape: CompletionShape) -> dict[str, Any]:
    """Wait for the whole answer; returns it in the shape's object or raises ApiError."""
    async with result_follower().subscribe(
        variant=submitted.variant, request_id=submitted.request_id, after_id="0-0"
    ) as subscription:
        answer = AnswerFold()
        try:
            async with asyncio.timeout(submitted.wait_limit_s):
                while not answer.finished:
                    answer.add_all(
                        event.body for event in await subscription.next_batch(submitted.wait_limit_s)
                    )
        except TimeoutError:
            await _cancel(submitted.request_id)
            raise _wait_limit_error(submitted) from None
    end = answer.end
    if isinstance(end, Error):
        raise generation_error(end.code, end.message)
    assert isinstance(end, Done)
    if end.finish_reason == "cancelled":
        raise _cancelled()
    return shape.whole(answer.text, end.finish_reason, end.usage)


def _json(data: dict[str, Any]) -> bytes:
    return sse_data(json.dumps(data, separators=(",", ":")))


DONE = sse_data("[DONE]")


async def completion_stream(submitted: SubmittedCompletion, shape: CompletionShape) -> AsyncIterator[bytes]:
    """The answer as OpenAI SSE chunks, ending with `data: [DONE]`. While subscribed the request
    counts as watched; once the client leaves, the worker cancels it after the API's grace."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + submitted.wait_limit_s
    async with result_follower().subscribe(
        variant=submitted.variant, request_id=submitted.request_id, after_id="0-0"
    ) as subscription:
        opening = shape.opening_chunk()
        if opening is not None:
            yield _json(opening)
        answer = AnswerFold()
        while True:
            left_s = deadline - loop.time()
            if left_s <= 0:
                await _cancel(submitted.request_id)
                yield _json(_wait_limit_error(submitted).body())
                yield DONE
                return
            try:
                events = await subscription.next_batch(min(settings.SSE_HEARTBEAT_S, left_s))
            except TimeoutError:
                yield sse_comment("keep-alive")  # proxies close connections that stay silent
                continue
            answer.add_all(event.body for event in events)
            if answer.restarted_after_sending:
                await _cancel(submitted.request_id)
                yield _json(_restarted().body())
                yield DONE
                return
            text = answer.unsent()
            if text:
                yield _json(shape.text_chunk(text))
            if answer.end is not None:
                for frame in _closing_frames(shape, answer.end):
                    yield frame
                return


def _closing_frames(shape: CompletionShape, end: Done | Error) -> list[bytes]:
    if isinstance(end, Error):
        return [_json(generation_error(end.code, end.message).body()), DONE]
    if end.finish_reason == "cancelled":
        return [_json(_cancelled().body()), DONE]
    frames = [_json(shape.closing_chunk(end.finish_reason))]
    if shape.include_usage:
        frames.append(_json(shape.usage_chunk(end.usage)))
    return [*frames, DONE]
