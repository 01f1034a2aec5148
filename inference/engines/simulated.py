"""A simulated GPU for tests and scheduling benchmarks (never for users, and it says so).

Cost model: each engine step decodes one token for every running sequence and takes
`decode_base_s + decode_per_seq_s * batch`; a sequence admitted in a step adds its prefill
(`prefill_s_per_token * prompt tokens`). At most `max_num_seqs` run; the rest wait. With all
costs at zero it is a pure token source for fan-out benchmarks.

`start_s` is how long `start()` takes, as a real engine loading its weights would: it makes a
cold start in the autoscaling benchmark as slow as one is on real hardware.

`failure_rate` makes that share of requests fail after a few tokens, as a faulty model build
would (the canary's rollback is tested with it).
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from inference.engines.base import Delta, EngineRequestError, EngineStats, GenerationRequest

KV_TOKENS_PER_SEQ = 2048
FAILURE_AFTER_TOKENS = 3  # a failing request streams this many tokens first
_FILLER_TEXT = (
    "Thanks for reaching out. This reply comes from the simulated engine, which stands in "
    "for a real model in tests and benchmarks. It streams words at the pace of a GPU cost "
    "model so that queues, batching and streaming can be measured without one."
)
_FILLER = _FILLER_TEXT.split()


def simulated_answer_tokens(request: GenerationRequest, count: int) -> list[str]:
    """The deterministic answer: labelled, echoing the question (or a raw prompt), then filler words."""
    question = request.prompt
    if question is None:
        question = next((m["content"] for m in reversed(request.messages) if m["role"] == "user"), "")
    words = ["[simulated]", "You", "asked:", *question.split()[:8], "—"]
    words += [_FILLER[i % len(_FILLER)] for i in range(max(0, count - len(words)))]
    return [word + " " for word in words[:count]]


def _prompt_tokens(request: GenerationRequest) -> int:
    """A word a token, plus what a chat template adds per message (a raw prompt has none)."""
    if request.prompt is not None:
        return len(request.prompt.split()) + 1
    return sum(len(m["content"].split()) + 4 for m in request.messages)


def _process_memory_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _machine_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(eq=False)
class _Sequence:
    request: GenerationRequest
    tokens: list[str]
    prompt_tokens: int
    outbox: asyncio.Queue[Delta] = field(default_factory=asyncio.Queue)
    produced: int = 0


class SimulatedEngine:
    def __init__(
        self,
        *,
        max_num_seqs: int,
        prefill_s_per_token: float,
        decode_base_s: float,
        decode_per_seq_s: float,
        output_tokens: int,
        failure_rate: float = 0.0,
        start_s: float = 0.0,
    ) -> None:
        self.label = "simulated"
        self.max_num_seqs = max_num_seqs
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_base_s = decode_base_s
        self.decode_per_seq_s = decode_per_seq_s
        self.output_tokens = output_tokens
        self.failure_rate = failure_rate
        self.start_s = start_s
        self._random = random.Random()
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[str, _Sequence] = {}
        self._work = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await asyncio.sleep(self.start_s)
        self._loop_task = asyncio.create_task(self._step_loop(), name="simulated-engine")

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        count = max(1, min(request.max_tokens, self.output_tokens))
        sequence = _Sequence(
            request=request,
            tokens=simulated_answer_tokens(request, count),
            prompt_tokens=_prompt_tokens(request),
        )
        fails_after = (
            min(FAILURE_AFTER_TOKENS, count - 1) if self._random.random() < self.failure_rate else None
        )
        self._waiting.append(sequence)
        self._work.set()
        try:
            while True:
                delta = await sequence.outbox.get()
                if fails_after is not None and delta.output_tokens > fails_after:
                    raise EngineRequestError(f"simulated failure of request {request.request_id}")
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            self._discard(request.request_id, sequence)

    async def abort(self, request_id: str) -> None:
        sequence = self._running.get(request_id)
        if sequence is not None:
            self._discard(request_id, sequence)
            sequence.outbox.put_nowait(
                Delta("", sequence.produced, sequence.prompt_tokens, finish_reason="abort")
            )

    def stats(self) -> EngineStats:
        used = sum(s.prompt_tokens + s.produced for s in self._running.values())
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_cache_usage=min(1.0, used / (KV_TOKENS_PER_SEQ * self.max_num_seqs)),
            memory_used_bytes=_process_memory_bytes(),
            memory_total_bytes=_machine_memory_bytes(),
            memory_source="process-rss",
        )

    async def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()

    def _discard(self, request_id: str, sequence: _Sequence) -> None:
        if self._running.get(request_id) is sequence:
            del self._running[request_id]
        elif sequence in self._waiting:
            self._waiting.remove(sequence)

    async def _step_loop(self) -> None:
        while True:
            if not self._running and not self._waiting:
                self._work.clear()
                await self._work.wait()
            prefill_tokens = 0
            while self._waiting and len(self._running) < self.max_num_seqs:
                sequence = self._waiting.popleft()
                self._running[sequence.request.request_id] = sequence
                prefill_tokens += sequence.prompt_tokens
            step_s = (
                self.decode_base_s
                + self.decode_per_seq_s * len(self._running)
                + self.prefill_s_per_token * prefill_tokens
            )
            await asyncio.sleep(step_s)
            for request_id, sequence in list(self._running.items()):
                token = sequence.tokens[sequence.produced]
                sequence.produced += 1
                finished = sequence.produced == len(sequence.tokens)
                finish_reason = None
                if finished:
                    finish_reason = (
                        "length" if len(sequence.tokens) == sequence.request.max_tokens else "stop"
                    )
                    del self._running[request_id]
                sequence.outbox.put_nowait(
                    Delta(token, sequence.produced, sequence.prompt_tokens, finish_reason)
                )
