"""Chat completions for the OpenAI-compatible API: submit to the scheduler, then follow the
request's result stream and answer whole or as OpenAI chunks.

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

import numpy as np
from asgiref.sync import sync_to_async
from django.conf import settings

from api.models import ApiKey
from api.openai_shapes import ApiError, ChatRequest, ChunkHeader, completion_id, completion_object
from chat.sse import sse_comment, sse_data
from knowledge import cache as answer_cache
from knowledge import selectors as knowledge_selectors
from scheduler import control
from scheduler.admission import request_answer_cached, request_submit
from scheduler.generation import AnswerFold, Done, Error, GenerationJob, Origin, Tier
from scheduler.models import CacheResult, Variant
from scheduler.policy import tier_policy
from scheduler.results import result_follower
from scheduler.routing import variant_for_conversation
from scheduler.rules import answer_wait_limit_s
from scheduler.services import generation_cache_note

# An answer that expired in the queue met a long queue moments ago: give it time to drain.
EXPIRED_RETRY_AFTER_S = 10


@dataclass(frozen=True, slots=True)
class SubmittedCompletion:
    request_id: str
    variant: str
    model: str  # whose result stream the answer is written to
    created: int
    wait_limit_s: float  # the longest the caller waits for the end of the answer


def _cache_lookup(
    *, api_key: ApiKey, request: ChatRequest, variant: Variant
) -> tuple[answer_cache.Lookup, str, np.ndarray] | None:
    """A one-question call (a single user message) is a first turn the result cache may answer;
    (the lookup, its context, the question's vector), or None when it may not be looked up."""
    if not settings.ANSWER_CACHE_ENABLED or [m["role"] for m in request.messages] != ["user"]:
        return None
    question = request.messages[0]["content"]
    if answer_cache.personal_data_found(question, names=answer_cache.account_names(api_key.owner)):
        return None
    try:
        vector = knowledge_selectors.question_vector(question)
    except knowledge_selectors.EmbedderUnavailable:
        return None
    context = answer_cache.api_context(variant, request.sampling_params())
    lookup = answer_cache.answer_lookup(
        variant=variant.name, context=context, question=question, vector=vector
    )
    return lookup, context, vector


def completion_submit(*, api_key: ApiKey, request: ChatRequest) -> SubmittedCompletion:
    """Admit the request under the key's tier and limits, or answer it from the result cache;
    raises AdmissionRefused."""
    request_id = str(uuid.uuid4())
    variant = variant_for_conversation(conversation_id=completion_id(request_id))
    tier = Tier(api_key.effective_tier)
    job = GenerationJob(
        request_id=request_id,
        origin=Origin.API,
        messages=request.messages,
        sampling=request.sampling_params(),
        client_id=api_key.client_id,
        tier=tier,
        variant=variant.name,
        model=variant.model,
        disconnect_grace_s=settings.API_DISCONNECT_GRACE_S,
    )
    cached = _cache_lookup(api_key=api_key, request=request, variant=variant)
    if cached is not None and cached[0].answer is not None:
        request_answer_cached(job=job, answer=cached[0].answer)
    else:
        request_submit(job=job)
    if cached is not None and cached[0].answer is None:
        lookup, context, vector = cached
        generation_cache_note(request_id=request_id, result=CacheResult.MISS, lookup_ms=lookup.lookup_ms)
        answer_cache.answer_remember(
            variant=variant.name,
            context=context,
            question=request.messages[0]["content"],
            vector=vector,
            kb_version=knowledge_selectors.knowledge_base_version(),
            source_slugs=[],
            request_id=request_id,
        )
    return SubmittedCompletion(
        request_id=request_id,
        variant=variant.name,
        model=variant.model,
        created=int(time.time()),
        wait_limit_s=answer_wait_limit_s(tier_policy(tier).max_wait_s),
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


async def completion_collect(submitted: SubmittedCompletion) -> dict[str, Any]:
    """Wait for the whole answer; returns a chat.completion object or raises ApiError."""
    async with result_follower().subscribe(
        model=submitted.model, request_id=submitted.request_id, after_id="0-0"
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
    return completion_object(
        request_id=submitted.request_id,
        created=submitted.created,
        model=submitted.variant,
        text=answer.text,
        finish_reason=end.finish_reason,
        usage=end.usage,
    )


def _json(data: dict[str, Any]) -> bytes:
    return sse_data(json.dumps(data, separators=(",", ":")))


DONE = sse_data("[DONE]")


async def completion_stream(submitted: SubmittedCompletion, *, include_usage: bool) -> AsyncIterator[bytes]:
    """The answer as OpenAI SSE chunks, ending with `data: [DONE]`. While subscribed the request
    counts as watched; once the client leaves, the worker cancels it after the API's grace."""
    header = ChunkHeader(submitted.request_id, submitted.created, submitted.variant, include_usage)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + submitted.wait_limit_s
    async with result_follower().subscribe(
        model=submitted.model, request_id=submitted.request_id, after_id="0-0"
    ) as subscription:
        yield _json(header.chunk({"role": "assistant", "content": ""}))
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
                yield _json(header.chunk({"content": text}))
            if answer.end is not None:
                for frame in _closing_frames(header, answer.end):
                    yield frame
                return


def _closing_frames(header: ChunkHeader, end: Done | Error) -> list[bytes]:
    if isinstance(end, Error):
        return [_json(generation_error(end.code, end.message).body()), DONE]
    if end.finish_reason == "cancelled":
        return [_json(_cancelled().body()), DONE]
    frames = [_json(header.chunk({}, end.finish_reason))]
    if header.include_usage:
        frames.append(_json(header.usage_chunk(end.usage)))
    return [*frames, DONE]
