"""A simulated GPU for tests and scheduling benchmarks (never for users, and it says so).

Cost model: each engine step decodes one token for every running sequence and takes
`decode_base_s + decode_per_seq_s * batch`; a sequence admitted in a step adds its prefill
(`prefill_s_per_token * prompt tokens`; a continuation of a preempted answer also recomputes the
tokens it had written). At most `max_num_seqs` run; the rest wait. With all
costs at zero it is a pure token source for fan-out benchmarks.

`start_s` is how long `start()` takes, as a real engine loading its weights would: it makes a
cold start in the autoscaling benchmark as slow as one is on real hardware.

`failure_rate` makes that share of requests fail after a few tokens, as a faulty model build
would (the canary's rollback is tested with it).

Sampling parameters are honoured where a model is not needed: max and min tokens, ignore_eos
(the answer's natural end is `output_tokens`), stop strings (kept in the answer with
include_stop_str_in_output), and the seed (it picks where the filler starts, so a seed gives the
same answer every time and two seeds two answers). What needs a model is simulated but
well-formed: a JSON output is the smallest JSON value valid against the schema (strings say
"simulated"), a choice is the first one, and every token's logprob is 0 (the answer is certain)
with the other candidates at vLLM's floor, -9999. Penalties, top_k, min_p, logit_bias,
stop_token_ids, bad_words, allowed_token_ids and the special-token options need a vocabulary and
change nothing here; nor does a regex or grammar constraint (the filler answers).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from inference.engines.base import Delta, EngineRequestError, EngineStats, GenerationRequest
from scheduler.generation import SamplingParams, TokenLogprob, TopLogprob

KV_TOKENS_PER_SEQ = 2048
FAILURE_AFTER_TOKENS = 3  # a failing request streams this many tokens first
_FILLER_TEXT = (
    "Thanks for reaching out. This reply comes from the simulated engine, which stands in "
    "for a real model in tests and benchmarks. It streams words at the pace of a GPU cost "
    "model so that queues, batching and streaming can be measured without one."
)
_FILLER = _FILLER_TEXT.split()


# vLLM's server floors log probabilities here; a candidate the simulation never picks has
# probability 0.
MIN_LOGPROB = -9999.0
MAX_JSON_DEPTH = 32
_JSON_PIECE = re.compile(r"\s*(?:\"(?:[^\"\\]|\\.)*\"|[^\s\"]{1,4})")


def simulated_answer_tokens(request: GenerationRequest, count: int) -> list[str]:
    """The deterministic answer of `count` tokens: labelled and echoing the question (or a raw
    prompt), then filler words (starting where the seed says)."""
    question = request.prompt
    if question is None:
        question = next((m["content"] for m in reversed(request.messages) if m["role"] == "user"), "")
    words = ["[simulated]", "You", "asked:", *question.split()[:8], "—"]
    seed = request.sampling.seed
    start = 0 if seed is None else seed % len(_FILLER)
    words += [_FILLER[(start + i) % len(_FILLER)] for i in range(max(0, count - len(words)))]
    return [word + " " for word in words[:count]]


def _structured_tokens(request: GenerationRequest) -> list[str] | None:
    """The answer's tokens when the output is JSON or one of some choices, else None (a
    regular expression or a grammar would need a generator of their own: the filler answers)."""
    structured = request.sampling.structured
    if structured is None or structured.regex is not None or structured.grammar is not None:
        return None
    if structured.choice is not None:
        return [structured.choice[0]]
    schema = structured.json_schema
    value = simulated_json(schema) if schema is not None else {"simulated": True}
    return _JSON_PIECE.findall(json.dumps(value))


def simulated_json(schema: dict[str, Any]) -> Any:
    """The smallest value valid against a JSON schema (the parts of JSON Schema that tool
    parameters and response formats use): required properties only, first choices, "simulated"
    for strings."""
    definitions = schema.get("$defs") if isinstance(schema.get("$defs"), dict) else {}

    def value(node: Any, depth: int = 0) -> Any:
        if not isinstance(node, dict) or depth > MAX_JSON_DEPTH:
            return None  # a schema too odd or too deep to follow: still valid JSON
        depth += 1
        if isinstance(node.get("$ref"), str):
            return value(definitions.get(node["$ref"].rsplit("/", 1)[-1], {}), depth)
        if "const" in node:
            return node["const"]
        if node.get("enum"):
            return node["enum"][0]
        for key in ("anyOf", "oneOf", "allOf"):
            if node.get(key) and isinstance(node[key], list) and isinstance(node[key][0], dict):
                return value({**node, key: None, **node[key][0]}, depth)
        kind = node.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind == "object" or (kind is None and "properties" in node):
            properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
            required = node.get("required") if isinstance(node.get("required"), list) else []
            return {str(name): value(properties.get(name, {}), depth) for name in required}
        if kind == "array":
            items = node.get("items")
            count = node.get("minItems") if isinstance(node.get("minItems"), int) else 0
            return [value(items if isinstance(items, dict) else {}, depth) for _ in range(min(count, 16))]
        if kind == "string":
            length = node.get("minLength") if isinstance(node.get("minLength"), int) else 0
            return "simulated".ljust(min(length, 1000), "!")
        if kind in ("integer", "number"):
            minimum = node.get("minimum")
            return minimum if isinstance(minimum, int | float) and not isinstance(minimum, bool) else 0
        if kind == "boolean":
            return False
        if kind == "null":
            return None
        return {}

    return value(schema)


def _answer_length(sampling: SamplingParams, natural_tokens: int) -> int:
    """Tokens the answer runs to: its natural end (where a model would write EOS) unless
    ignore_eos, at least min_tokens, at most max_tokens."""
    length = sampling.max_tokens if sampling.ignore_eos else natural_tokens
    return max(1, min(sampling.max_tokens, max(length, sampling.min_tokens)))


def _stopped(tokens: list[str], sampling: SamplingParams) -> tuple[list[str], bool]:
    """The tokens up to the first stop string (which is not part of the answer unless
    `include_stop_str_in_output`, as in vLLM), and whether one was found; stop strings count
    only from min_tokens on."""
    text = ""
    for n, token in enumerate(tokens):
        text += token
        if n + 1 < sampling.min_tokens:
            continue
        starts = [(text.find(s, max(0, len(text) - len(token) - len(s) + 1)), s) for s in sampling.stop]
        found = [(start, s) for start, s in starts if start >= 0]
        if found:
            start, stop = min(found)
            kept = text[: start + len(stop) if sampling.include_stop_str_in_output else start]
            before = "".join(tokens[:n])
            return [*tokens[:n], kept[len(before) :]], True
    return tokens, False


def _logprobs(token: str, top: int) -> tuple[TokenLogprob, ...]:
    """The sampled token, then `top` more candidates (-1: all the simulation knows), as vLLM's
    engine returns them."""
    encoded = list(token.encode())
    others = [word + " " for word in dict.fromkeys(_FILLER) if word + " " != token]
    candidates = [
        TopLogprob(token=token, logprob=0.0, bytes=encoded),
        *(TopLogprob(token=word, logprob=MIN_LOGPROB, bytes=list(word.encode())) for word in others),
    ]
    shown = candidates if top == -1 else candidates[: top + 1]
    return (TokenLogprob(token=token, logprob=0.0, bytes=encoded, top_logprobs=tuple(shown)),)


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
    prefill_tokens: int  # what admitting it costs: the prompt, and a continuation's tokens
    stopped: bool  # ends at a stop string
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
        sampling = request.sampling
        structured = _structured_tokens(request)
        if structured is None:
            answer = simulated_answer_tokens(request, _answer_length(sampling, self.output_tokens))
        else:
            # A JSON value ends where it closes; whitespace after it keeps it valid.
            length = _answer_length(sampling, len(structured))
            answer = (structured + [" "] * length)[:length]
        tokens, stopped = _stopped(answer, sampling)
        count = len(tokens)
        prompt_tokens = _prompt_tokens(request)
        # A continuation resumes the same answer after the tokens already written, and pays
        # their prefill again (the KV cache was freed when the worker preempted it).
        written = 0 if request.continuation is None else request.continuation.output_tokens
        sequence = _Sequence(
            request=request,
            tokens=tokens,
            prompt_tokens=prompt_tokens,
            prefill_tokens=prompt_tokens + written,
            stopped=stopped,
            produced=written,
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
                prefill_tokens += sequence.prefill_tokens
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
                    at_limit = len(sequence.tokens) == sequence.request.sampling.max_tokens
                    finish_reason = "length" if at_limit and not sequence.stopped else "stop"
                    del self._running[request_id]
                top = sequence.request.sampling.logprobs
                sequence.outbox.put_nowait(
                    Delta(
                        token,
                        sequence.produced,
                        sequence.prompt_tokens,
                        finish_reason,
                        logprobs=None if top is None else _logprobs(token, top),
                    )
                )
