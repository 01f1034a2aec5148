"""Chat and text completions for the OpenAI-compatible API: submit to the scheduler (one
generation per choice), then follow their result streams and answer whole or as OpenAI chunks
(a chat completion's or a text completion's).

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
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings

from api.errors import ApiError, generation_error, invalid, model_not_found, request_too_large
from api.metrics import key_rate_limited_record
from api.models import ApiKey
from api.openai_requests import GREEDY_TEMPERATURE, ChatCompletionRequest, CompletionRequest, NamedToolChoice
from api.openai_responses import ChoiceDelta
from api.openai_shapes import (
    ChoiceOutcome,
    ChunkHeader,
    TextChunkHeader,
    completion_id,
    completion_object,
    logprobs_shape,
    named_tool_call_delta,
    parsed_delta,
    ratelimit_headers,
    required_tool_calls,
    text_completion_object,
    text_logprobs_shape,
    tool_calls_delta,
)
from chat.sse import sse_comment, sse_data
from knowledge import cache as answer_cache
from knowledge import selectors as knowledge_selectors
from scheduler import control
from scheduler.admission import AdmissionRefused, request_answer_known, request_submit, request_withdraw
from scheduler.generation import (
    AnswerFold,
    Done,
    Error,
    GenerationJob,
    Origin,
    ParsedDelta,
    Tier,
    Token,
    Usage,
    tokens_logprobs,
)
from scheduler.models import CacheResult, Variant
from scheduler.policy import tier_policy
from scheduler.prompt import prompt_token_count, text_prompt_token_count
from scheduler.results import ResultEvent, result_follower
from scheduler.routing import variant_for_request
from scheduler.rules import answer_wait_limit_s
from scheduler.services import generation_cache_note

# Admission's refusals for a key's own limits -> the limit, as the metrics name it.
KEY_LIMIT_REASONS = {"rate_limited_key_requests": "requests", "rate_limited_key_tokens": "tokens"}

AnyCompletionRequest = ChatCompletionRequest | CompletionRequest


@dataclass(frozen=True, slots=True)
class SubmittedCompletion:
    request: AnyCompletionRequest
    request_ids: list[str]  # one generation per choice; the first names the completion
    variant: str
    model: str  # whose result streams the answers are written to
    created: int
    wait_limit_s: float  # the longest the caller waits for the end of the answer
    ratelimit_headers: dict[str, str]  # the key's x-ratelimit-* after this request; {} unlimited

    @property
    def request_id(self) -> str:
        return self.request_ids[0]


def _cache_lookup(
    *, api_key: ApiKey, request: AnyCompletionRequest, variant: Variant
) -> tuple[answer_cache.Lookup, str] | None:
    """A one-question call (a single user message, one choice, no tools, no logprobs) whose
    answer does not depend on chance (greedy or seeded) is a first turn the result cache may
    answer, for the very same text alone: a program asking again gets the answer `vllm serve`
    would give it, never one to another spelling, a similar question or one sampled for
    someone else; nothing marks it as cached (docs/ARCHITECTURE.md, "/v1 and the cache").
    (The lookup, its context), or None when it may not be looked up."""
    if not settings.ANSWER_CACHE_ENABLED or isinstance(request, CompletionRequest):
        return None  # a raw prompt is no customer's question
    messages = request.prompt_messages()
    sampling = request.sampling_params()
    if (
        [m["role"] for m in messages] != ["user"]
        or request.choices != 1
        or request.tools is not None
        or request.logprobs
        or (sampling.temperature >= GREEDY_TEMPERATURE and sampling.seed is None)
    ):
        return None
    question = messages[0]["content"]
    if answer_cache.question_personal(question, names=answer_cache.account_names(api_key.owner)):
        return None
    context = answer_cache.api_context(variant, sampling)
    lookup = answer_cache.answer_lookup(
        variant=variant.name,
        context=context,
        question=question,
        vector=None,
        customer=answer_cache.customer_key(client_id=api_key.client_id),
    )
    return lookup, context


def _tokens_at_most(request: AnyCompletionRequest) -> int:
    """The most tokens one choice of the request may use: its prompt and its max_tokens."""
    if isinstance(request, CompletionRequest):
        prompt_tokens = text_prompt_token_count(request.prompt_text, model_path=settings.INFERENCE_MODEL)
    else:
        prompt_tokens = prompt_token_count(request.prompt_messages(), model_path=settings.INFERENCE_MODEL)
    return prompt_tokens + request.answer_max_tokens


def completion_submit(*, api_key: ApiKey, request: AnyCompletionRequest) -> SubmittedCompletion:
    """Admit the request under the key's tier and limits, or answer it from the result cache;
    raises AdmissionRefused, or ApiError for a model no variant answers (404) or a request larger
    than its key's tokens per minute (it would never be admitted).

    Each of the `n` choices is a generation of its own (a job, a record, a result stream), so
    it counts against the key's limits as a request would; if one is refused, those already
    admitted are withdrawn (cancelled, their charges given back) and the call is refused as a
    whole, charging nothing."""
    request_ids = [str(uuid.uuid4()) for _ in range(request.choices)]
    text = isinstance(request, CompletionRequest)
    auto_tools = not text and request.tool_choice_auto
    variant = variant_for_request(
        model=request.model, request_id=completion_id(request_ids[0]), needs_tool_parser=auto_tools
    )
    if variant is None:
        raise model_not_found(request.model)
    if auto_tools and not variant.tool_call_parser:
        raise _auto_tool_choice_unavailable()
    tool_parsing = None if text else request.tool_parsing(variant.tool_call_parser)
    tier = Tier(api_key.effective_tier)
    limits = api_key.limits
    tokens = _tokens_at_most(request) if limits.tokens_per_minute is not None else 0
    if limits.tokens_per_minute is not None and tokens * len(request_ids) > limits.tokens_per_minute:
        raise request_too_large(
            api_key=api_key, tokens=tokens * len(request_ids), tokens_per_minute=limits.tokens_per_minute
        )
    jobs = [
        GenerationJob(
            request_id=request_id,
            origin=Origin.API,
            messages=[] if text else request.prompt_messages(),
            sampling=request.sampling_params(seed_offset=index),
            client_id=api_key.client_id,
            tier=tier,
            variant=variant.name,
            model=variant.model,
            disconnect_grace_s=settings.API_DISCONNECT_GRACE_S,
            prompt=request.prompt_text if text else None,
            choice=index,
            tool_parsing=tool_parsing,
        )
        for index, request_id in enumerate(request_ids)
    ]
    cached = _cache_lookup(api_key=api_key, request=request, variant=variant)
    key_state = None
    try:
        if cached is not None and cached[0].answer is not None:
            answer = cached[0].answer
            # The key pays what the cached answer used: its prompt and its completion.
            used = tokens - request.answer_max_tokens + answer.completion_tokens if tokens else 0
            admission = request_answer_known(job=jobs[0], answer=answer, limits=limits, tokens=used)
            key_state = admission.key_state
        else:
            for index, job in enumerate(jobs):
                try:
                    admission = request_submit(job=job, limits=limits, tokens=tokens)
                except AdmissionRefused:
                    for admitted in jobs[:index]:
                        request_withdraw(job=admitted, limits=limits, tokens=tokens)
                    raise
                key_state = admission.key_state
    except AdmissionRefused as refusal:
        if refusal.reason in KEY_LIMIT_REASONS:
            key_rate_limited_record(api_key=api_key, limit=KEY_LIMIT_REASONS[refusal.reason])
        raise
    if cached is not None and cached[0].answer is None:
        lookup, context = cached
        generation_cache_note(request_id=request_ids[0], result=CacheResult.MISS, lookup_ms=lookup.lookup_ms)
        answer_cache.answer_remember(
            variant=variant.name,
            context=context,
            question=jobs[0].messages[0]["content"],
            vector=None,
            kb_version=knowledge_selectors.knowledge_base_version(),
            help_center=False,  # the caller's messages are the whole prompt
            source_slugs=[],
            request_id=request_ids[0],
            customer=answer_cache.customer_key(client_id=api_key.client_id),
        )
    return SubmittedCompletion(
        request=request,
        request_ids=request_ids,
        variant=variant.name,
        model=variant.model,
        created=int(time.time()),
        wait_limit_s=answer_wait_limit_s(tier_policy(tier).max_wait_s),
        ratelimit_headers=ratelimit_headers(key_state) if key_state else {},
    )


def _auto_tool_choice_unavailable() -> ApiError:
    """vLLM's answer to tool_choice "auto" when it runs without a tool-call parser."""
    return invalid(
        '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set: '
        'this model has no tool-call parser here. Use tool_choice "required" or name the function.',
        "tool_choice",
    )


def _cancelled() -> ApiError:
    return generation_error("cancelled", "The request was cancelled before its answer was finished.")


def _restarted() -> ApiError:
    return generation_error(
        "generation_restarted",
        "The server answering this request failed mid-answer; please send the request again.",
    )


def _wait_limit_error(submitted: SubmittedCompletion) -> ApiError:
    return generation_error("timeout", f"No complete answer within {submitted.wait_limit_s:.0f} s.")


async def _cancel(*request_ids: str) -> None:
    def cancel_all() -> None:
        for request_id in request_ids:
            control.request_cancel(request_id=request_id)

    await sync_to_async(cancel_all, thread_sensitive=False)()


def _outcome(answer: AnswerFold) -> ChoiceOutcome:
    """A finished choice, or the ApiError it ended with."""
    end = answer.end
    if isinstance(end, Error):
        raise generation_error(end.code, end.message)
    assert isinstance(end, Done)
    if end.finish_reason == "cancelled":
        raise _cancelled()
    return ChoiceOutcome(
        text=answer.text, finish_reason=end.finish_reason, logprobs=answer.logprobs, parsed=end.parsed
    )


def _usage(answers: list[AnswerFold]) -> Usage:
    """As vLLM counts n choices: the prompt once, every choice's completion."""
    ends = [answer.end for answer in answers if isinstance(answer.end, Done)]
    return Usage(
        prompt_tokens=ends[0].usage.prompt_tokens if ends else 0,
        completion_tokens=sum(end.usage.completion_tokens for end in ends),
    )


async def _next_batches(
    subscriptions: dict[int, Any], timeout_s: float
) -> list[tuple[int, list[ResultEvent]]]:
    """What arrived on any of the choices' subscriptions (by choice index), waiting up to
    `timeout_s` for the first (else TimeoutError)."""
    if len(subscriptions) == 1:
        [(index, subscription)] = subscriptions.items()
        return [(index, await subscription.next_batch(timeout_s))]
    waits = {
        asyncio.ensure_future(subscription.next_batch(timeout_s)): index
        for index, subscription in subscriptions.items()
    }
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    # A wait that finished while the others were being cancelled has taken its batch: keep it.
    arrived = [
        (index, wait.result())
        for wait, index in waits.items()
        if not wait.cancelled() and not isinstance(wait.exception(), TimeoutError)
    ]
    if not arrived:
        raise TimeoutError
    return arrived


async def completion_collect(submitted: SubmittedCompletion) -> dict[str, Any]:
    """Wait for the whole answer (every choice); returns a chat.completion or text_completion
    object or raises ApiError (the first failed choice's; the others are then cancelled)."""
    answers = [AnswerFold() for _ in submitted.request_ids]
    async with AsyncExitStack() as stack:
        following = {
            index: await stack.enter_async_context(
                result_follower().subscribe(model=submitted.model, request_id=request_id, after_id="0-0")
            )
            for index, request_id in enumerate(submitted.request_ids)
        }
        try:
            async with asyncio.timeout(submitted.wait_limit_s):
                while following:
                    for index, events in await _next_batches(following, submitted.wait_limit_s):
                        answers[index].add_all(event.body for event in events)
                        if answers[index].finished:
                            del following[index]
                            if isinstance(answers[index].end, Error):
                                break
                    if any(isinstance(answer.end, Error) for answer in answers):
                        break
        except TimeoutError:
            await _cancel(*submitted.request_ids)
            raise _wait_limit_error(submitted) from None
    try:
        outcomes = [_outcome(answer) for answer in answers if answer.finished]
    except ApiError:
        await _cancel(*submitted.request_ids)
        raise
    request = submitted.request
    if isinstance(request, CompletionRequest):
        return text_completion_object(
            request_id=submitted.request_id,
            created=submitted.created,
            model=submitted.variant,
            choices=outcomes,
            usage=_usage(answers),
            request=request,
        )
    return completion_object(
        request_id=submitted.request_id,
        created=submitted.created,
        model=submitted.variant,
        choices=outcomes,
        usage=_usage(answers),
        request=request,
    )


def _json(data: dict[str, Any]) -> bytes:
    return sse_data(json.dumps(data, separators=(",", ":")))


DONE = sse_data("[DONE]")


class _ChoiceStream:
    """One choice of a streamed chat completion: its events in, its chunks out."""

    def __init__(self, index: int, header: ChunkHeader, request: ChatCompletionRequest) -> None:
        self.index = index
        self.header = header
        self.request = request
        self.answer = AnswerFold()
        self._named_tool_started = False
        self._tool_calls_streamed = False
        self._opened = False

    def chunks(self) -> list[dict[str, Any]]:
        """The chunks for what arrived since the last call: text (or a named tool call's
        arguments) with its logprobs, then the closing chunk once the choice has finished. The
        role chunk opens the choice with its first token, as vLLM's server sends it: a client
        timing the first chunk times the first token, not the admission."""
        chunks = []
        if not self._opened and (self.answer.has_tokens or isinstance(self.answer.end, Done)):
            chunks.append(self.header.chunk(ChoiceDelta(role="assistant", content=""), index=self.index))
            self._opened = True
        choice = self.request.tool_choice
        # "required" calls are sent whole once complete: until then nothing is taken (and a
        # restart before the end is carried on, as nothing went out).
        tokens = [] if choice == "required" else self.answer.unsent_tokens()
        text = "".join(token.text for token in tokens)
        delta: ChoiceDelta | None = None
        if text and isinstance(choice, NamedToolChoice):
            delta = named_tool_call_delta(None if self._named_tool_started else choice.function.name, text)
            self._named_tool_started = True
        elif choice == "auto" and any(token.parsed is not None for token in tokens):
            delta = parsed_delta(_parsed_together(tokens))
            self._tool_calls_streamed = self._tool_calls_streamed or bool(delta and delta.tool_calls)
            if delta is None and self.request.logprobs:
                delta = ChoiceDelta()  # as vLLM: the tokens' logprobs go out even while held back
        elif text:
            delta = ChoiceDelta(content=text)
        if delta is not None:
            logprobs = (
                logprobs_shape(tokens_logprobs(tokens) or (), self.request.top_logprobs or 0)
                if self.request.logprobs
                else None
            )
            chunks.append(self.header.chunk(delta, index=self.index, logprobs=logprobs))
        end = self.answer.end
        if isinstance(end, Done) and end.finish_reason != "cancelled":
            finish_reason = end.finish_reason
            if choice == "required":
                calls = required_tool_calls(self.answer.text, as_written=True)
                if calls:
                    chunks.append(self.header.chunk(tool_calls_delta(calls), index=self.index))
                if finish_reason == "stop":
                    finish_reason = "tool_calls"
            elif self._tool_calls_streamed and finish_reason == "stop":
                finish_reason = "tool_calls"  # as vLLM's stream, for an "auto" answer that called tools
            chunks.append(self.header.chunk(ChoiceDelta(), finish_reason, index=self.index))
        return chunks


def _parsed_together(tokens: list[Token]) -> ParsedDelta:
    """Several engine steps' parsed deltas as one chunk's: the content joined, the pieces of
    calls in order (a client appends each piece to its call by index)."""
    contents = [token.parsed.content for token in tokens if token.parsed and token.parsed.content is not None]
    return ParsedDelta(
        content="".join(contents) if contents else None,
        tool_calls=tuple(call for token in tokens if token.parsed for call in token.parsed.tool_calls),
    )


class _TextChoiceStream:
    """One choice of a streamed text completion: its events in, its chunks out (the same
    text_completion object with the new text)."""

    def __init__(self, index: int, header: TextChunkHeader, logprobs: int | None) -> None:
        self.index = index
        self.header = header
        self.logprobs = logprobs
        self.answer = AnswerFold()
        self._text_offset = 0  # where the next chunk's first token starts in the answer

    def chunks(self) -> list[dict[str, Any]]:
        chunks = []
        tokens = self.answer.unsent_tokens()
        text = "".join(token.text for token in tokens)
        if text:
            logprobs = None
            if self.logprobs is not None:
                entries = tokens_logprobs(tokens) or []
                logprobs = text_logprobs_shape(entries, self.logprobs, self._text_offset)
                # As vLLM: on by the tokens reported (text held back for a stop string lags them).
                self._text_offset += sum(len(entry.token) for entry in entries)
            chunks.append(self.header.chunk(text, index=self.index, logprobs=logprobs))
        end = self.answer.end
        if isinstance(end, Done) and end.finish_reason != "cancelled":
            chunks.append(self.header.chunk("", end.finish_reason, index=self.index))
        return chunks


def _choice_streams(submitted: SubmittedCompletion) -> tuple[ChunkHeader | TextChunkHeader, list[Any]]:
    request = submitted.request
    indexes = range(len(submitted.request_ids))
    if isinstance(request, CompletionRequest):
        text_header = TextChunkHeader(
            submitted.request_id, submitted.created, submitted.variant, request.include_usage
        )
        return text_header, [_TextChoiceStream(index, text_header, request.logprobs) for index in indexes]
    header = ChunkHeader(submitted.request_id, submitted.created, submitted.variant, request.include_usage)
    return header, [_ChoiceStream(index, header, request) for index in indexes]


async def completion_stream(submitted: SubmittedCompletion) -> AsyncIterator[bytes]:
    """The answer as OpenAI SSE chunks (each choice's interleaved, as they come), ending with
    `data: [DONE]`. While subscribed the requests count as watched; once the client leaves, the
    worker cancels them after the API's grace."""
    header, choices = _choice_streams(submitted)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + submitted.wait_limit_s
    async with AsyncExitStack() as stack:
        following = {
            index: await stack.enter_async_context(
                result_follower().subscribe(model=submitted.model, request_id=request_id, after_id="0-0")
            )
            for index, request_id in enumerate(submitted.request_ids)
        }
        while following:
            left_s = deadline - loop.time()
            if left_s <= 0:
                await _cancel(*submitted.request_ids)
                yield _json(_wait_limit_error(submitted).body())
                yield DONE
                return
            try:
                arrived = await _next_batches(following, min(settings.SSE_HEARTBEAT_S, left_s))
            except TimeoutError:
                yield sse_comment("keep-alive")  # proxies close connections that stay silent
                continue
            for index, events in arrived:
                choice = choices[index]
                choice.answer.add_all(event.body for event in events)
                failure = _failure(choice.answer)
                if failure is not None:
                    await _cancel(*submitted.request_ids)
                    yield _json(failure.body())
                    yield DONE
                    return
                for chunk in choice.chunks():
                    yield _json(chunk)
                if choice.answer.finished:
                    del following[index]
    if header.include_usage:
        yield _json(header.usage_chunk(_usage([choice.answer for choice in choices])))
    yield DONE


def _failure(answer: AnswerFold) -> ApiError | None:
    """Why a streamed choice cannot go on, if it cannot."""
    if answer.restarted_after_sending:
        return _restarted()
    end = answer.end
    if isinstance(end, Error):
        return generation_error(end.code, end.message)
    if isinstance(end, Done) and end.finish_reason == "cancelled":
        return _cancelled()
    return None
