"""One claimed job through the engine: its tokens published as they come (or, for a verified
answer, each sentence once its facts are checked), a pause for a VIP or fair-share newcomer
and the resume from its streamed text, and how it ended, as an outcome for the worker to store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from inference.engines.base import (
    Continuation,
    Delta,
    Engine,
    EngineRequestError,
    GenerationRequest,
)
from inference.slots import Answer
from knowledge.grounding import AnswerChecker
from scheduler.generation import (
    TERMINAL_EVENTS,
    EventBody,
    ParsedAnswer,
    Queued,
    Reset,
    Start,
    Tier,
    Timings,
    Token,
    Usage,
)
from scheduler.models import Generation
from scheduler.queues import Job
from scheduler.services import GenerationOutcome

logger = logging.getLogger(__name__)

Emit = Callable[[EventBody], "asyncio.Future[None]"]


@dataclass(frozen=True, slots=True)
class Written:
    """How an answer ended, for the worker to store and publish."""

    outcome: GenerationOutcome
    parsed: ParsedAnswer | None = None  # the answer as its tool-call parser read it
    service_s: float | None = None  # engine time, pauses left out: only for a finished answer


class AnswerWriter:
    def __init__(
        self, engine: Engine, *, worker_id: str, timeout_s: float, draining: Callable[[], bool]
    ) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.timeout_s = timeout_s
        self._draining = draining

    async def write(self, answer: Answer, emit: Emit) -> Written | None:
        """Run the job; None when it had ended before this claim (nothing to store again).
        Raises CancelledError when cut short by a stopping worker (the job goes back)."""
        job = answer.job
        previous = answer.previous_event
        if previous in TERMINAL_EVENTS:
            return None  # finished before the previous worker could acknowledge it
        if previous != Queued.type:
            # A worker that died or drained had started it: the client starts the answer over.
            emit(Reset(reason="worker_restarted", attempt=job.attempt))
        if answer.cancel_requested:
            return Written(GenerationOutcome(status=Generation.Status.CANCELLED, finish_reason="cancelled"))
        if job.attempt == 1 and time.time() > job.deadline:
            return Written(
                GenerationOutcome(
                    status=Generation.Status.ERROR,
                    error_code="expired",
                    error_message="Sorry, we were too busy to answer in time. Please ask again.",
                )
            )
        emit(Start(worker=self.worker_id, variant=job.generation.variant, attempt=job.attempt))
        started = time.monotonic()
        ttft_ms: float | None = None
        finish_reason = "stop"
        last: Delta | None = None
        counted = 0  # output tokens that token events have told of (a delta's count is cumulative)
        paused_s = 0.0  # not service: another answer had the slot
        # A verified answer: its text is shown sentence by sentence, once checked.
        grounding = job.generation.grounding
        checker = AnswerChecker(grounding) if grounding is not None else None
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    request = GenerationRequest(
                        request_id=job.request_id,
                        messages=job.generation.messages,
                        sampling=job.generation.sampling,
                        prompt=job.generation.prompt,
                        continuation=_continuation(answer, last),
                        tool_parsing=job.generation.tool_parsing,
                    )
                    answer.preemptible = job.tier != Tier.VIP
                    try:
                        async for last in self.engine.generate(request):
                            # A last step may write no text and still release what the
                            # tool-call parser held back (content, or a call's last piece).
                            held_back = last.parsed and (last.parsed.tool_calls or last.parsed.content)
                            text = last.text if checker is None else checker.feed(last.text)
                            if text or last.logprobs or held_back:
                                if ttft_ms is None:
                                    ttft_ms = (time.monotonic() - started) * 1000
                                emit(
                                    Token(
                                        seq=len(answer.text),
                                        text=text,
                                        tokens=last.output_tokens - counted,
                                        logprobs=last.logprobs,
                                        parsed=last.parsed,
                                    )
                                )
                                answer.text.append(text)
                                counted = last.output_tokens
                            if last.finish_reason is not None:
                                finish_reason = last.finish_reason
                    except asyncio.CancelledError:
                        answer.preemptible = False
                        if not answer.preempted or answer.cancel_requested or self._draining():
                            raise
                        answer.preempted = False
                        # Paused for another job: the engine request is gone (and its KV
                        # cache); the customer sees a pause, then the answer goes on.
                        asyncio.current_task().uncancel()  # type: ignore[union-attr]
                        paused_at = time.monotonic()
                        await answer.resumed.wait()
                        answer.resumed.clear()
                        paused_s += time.monotonic() - paused_at
                        continue
                    answer.preemptible = False
                    break
        except TimeoutError:
            return Written(
                GenerationOutcome(
                    status=Generation.Status.ERROR,
                    text="".join(answer.text),
                    error_code="timeout",
                    error_message=f"The answer took longer than {self.timeout_s:.0f} s and was stopped.",
                )
            )
        except EngineRequestError as exc:
            # This request failed, not the engine: the answer ends with an error and the job is
            # acknowledged, since running it again would most likely fail the same way.
            logger.warning("worker %s: %s failed in the engine: %s", self.worker_id, job.request_id, exc)
            return Written(
                GenerationOutcome(
                    status=Generation.Status.ERROR,
                    text="".join(answer.text),
                    error_code="engine_error",
                    error_message="Sorry, the model failed while writing this answer. Please try again.",
                    usage=_usage(last),
                    timings=self._timings(job, started, ttft_ms),
                )
            )
        except asyncio.CancelledError:
            if not answer.cancel_requested or self._draining():
                raise
            finish_reason = "abort"
        if finish_reason == "abort":
            return Written(
                GenerationOutcome(
                    status=Generation.Status.CANCELLED,
                    text="".join(answer.text),
                    finish_reason="cancelled",
                    usage=_usage(last),
                    timings=self._timings(job, started, ttft_ms),
                ),
                parsed=last.parsed_answer if last is not None else None,
            )
        service_s = time.monotonic() - started - paused_s
        if checker is not None and (rest := checker.finish(cut_off=finish_reason == "length")):
            if ttft_ms is None:
                ttft_ms = (time.monotonic() - started) * 1000
            tokens = last.output_tokens - counted if last is not None else 0
            emit(Token(seq=len(answer.text), text=rest, tokens=tokens))
            answer.text.append(rest)
        return Written(
            GenerationOutcome(
                status=Generation.Status.DONE,
                text="".join(answer.text),
                finish_reason=finish_reason,
                usage=_usage(last),
                timings=self._timings(job, started, ttft_ms),
                grounding=checker.report() if checker is not None else None,
            ),
            parsed=last.parsed_answer if last is not None else None,
            service_s=service_s,
        )

    def _timings(self, job: Job, started: float, ttft_ms: float | None) -> Timings:
        elapsed_ms = (time.monotonic() - started) * 1000
        return Timings(
            queue_ms=round((time.time() - job.enqueued_at) * 1000 - elapsed_ms, 1),
            ttft_ms=round(ttft_ms, 1) if ttft_ms is not None else None,
            duration_ms=round(elapsed_ms, 1),
            engine=self.engine.label,
        )


def _continuation(answer: Answer, last: Delta | None) -> Continuation | None:
    """What a resumed answer goes on from: its streamed text (None before its first token)."""
    if last is None or last.output_tokens == 0:
        return None
    return Continuation(text="".join(answer.text), output_tokens=last.output_tokens)


def _usage(last: Delta | None) -> Usage:
    """Token counts as OpenAI reports them, from the last delta (its counts are cumulative)."""
    if last is None:
        return Usage()
    return Usage(prompt_tokens=last.prompt_tokens, completion_tokens=last.output_tokens)
