"""The engine interface the worker drives: one async generator per request, abort, stats.

Two implementations live beside this file: `vllm` (production) and `simulated` (a cost model
for fast tests and scheduling benchmarks). `inference.engines.build_engine` picks one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.generation import (
    GenerationJob,
    ParsedAnswer,
    ParsedDelta,
    SamplingParams,
    TokenLogprob,
    ToolParsing,
)


class EngineDeadError(RuntimeError):
    """The engine can no longer serve any request; the worker must stop and hand jobs back."""


class EngineRequestError(RuntimeError):
    """One request failed inside the engine, which goes on serving the others: the answer ends
    with an error, and retrying it elsewhere would not help."""


@dataclass(frozen=True, slots=True)
class Continuation:
    """The part of the answer already streamed before the worker preempted it: the engine
    opens the assistant's turn with `text` (recomputing its KV, as vLLM does for a sequence it
    preempts) and streams only what follows, counting `output_tokens` as already written."""

    text: str
    output_tokens: int


def resumable(job: GenerationJob) -> bool:
    """Whether the job's answer goes on after a Continuation as it would have without the
    pause. Not one read for tool calls (the parser's state cannot restart half-way), not a
    structured output (its grammar cannot restart half-way through the JSON), not seeded random
    sampling (the seed would restart its random stream, and the same
    request would no longer give the same answer), not a presence penalty (taken once per token
    over the output: the written tokens, now in the prompt, would be penalised again when they
    recur). A frequency penalty resumes: an engine continuing an answer counts the tokens it
    had written (vLLM: as a logit bias). Logprobs resume: the streamed tokens' were sent
    already, and the rest are computed after the same text."""
    sampling = job.sampling
    return (
        job.tool_parsing is None
        and sampling.structured is None
        and (sampling.seed is None or sampling.temperature == 0)
        and sampling.presence_penalty == 0
    )


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    messages: list[dict[str, str]]  # OpenAI-style [{"role": ..., "content": ...}]
    sampling: SamplingParams = field(
        default_factory=lambda: SamplingParams(max_tokens=256, temperature=0.7, top_p=1.0)
    )
    # A text completion's raw prompt, continued without the chat template; `messages` is empty.
    prompt: str | None = None
    # A paused answer's streamed part: the engine goes on after it (appended to the chat's open
    # assistant turn, or to a raw prompt). Sampling limits (max and min tokens) apply to the
    # whole answer, continuation included.
    continuation: Continuation | None = None
    # The answer is read for tool calls with vLLM's parser (an engine that has none: not read).
    tool_parsing: ToolParsing | None = None


@dataclass(frozen=True, slots=True)
class Delta:
    """What one engine step produced for one request."""

    text: str
    output_tokens: int  # cumulative output tokens of the whole answer (a continuation's included)
    prompt_tokens: int  # the prompt's, without a continuation
    finish_reason: str | None = None  # "stop" | "length" | "abort" on the last delta
    # One entry per token of `text` when the request asked for logprobs, else None.
    logprobs: tuple[TokenLogprob, ...] | None = None
    # With tool_parsing: what the parser made of `text`, and on the last delta of the whole answer.
    parsed: ParsedDelta | None = None
    parsed_answer: ParsedAnswer | None = None


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: int
    waiting: int
    kv_cache_usage: float  # 0..1
    memory_used_bytes: int
    memory_total_bytes: int
    memory_source: str  # "cuda" on a GPU, else "process-rss" (the engine process's memory)
    # Prompt tokens looked up in the engine's prefix cache since it started, and those found
    # there (vLLM's own counts; the simulated engine keeps none).
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


class Engine(Protocol):
    label: str  # shown wherever output is displayed, e.g. "vllm:SmolLM2-135M-Instruct"
    max_num_seqs: int

    async def start(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """Stream deltas; closing the iterator early aborts the request in the engine."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats:
        """Its counts now; raises EngineDeadError once the engine has died, even idle."""
        ...

    async def shutdown(self) -> None: ...
