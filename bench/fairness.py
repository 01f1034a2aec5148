"""Fair share inside a tier: 20 chat customers of the normal tier asking at a steady pace, alone
and beside one API key of the same tier that keeps five times the tier's slots busy, with fair
share (FAIR_SHARE; pausing the key's answers after each grace asked for, or waiting for a slot)
and with plain arrival order; on the simulated engine with the shipped slots.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import psutil
import redis.asyncio as aioredis

from bench.client import Session
from bench.stack import UNLIMITED, question, running
from bench.stats import distribution
from scheduler import keys

CUSTOMERS = 20
THINK_S = 3.0  # a customer reads the answer this long before asking again
FLOOD_TOKENS = 128  # each of the key's answers, to the token (ignore_eos)
SLOTS = 16  # INFERENCE_MAX_NUM_SEQS as shipped
VIP_RESERVED = 2  # VIP_RESERVED_SLOTS as shipped: the normal tier has the other 14
FLOOD_FACTOR = 5  # the key keeps this many times the normal tier's slots in requests open
WARMUP_S = 10.0  # the flood fills the queue before the customers start
SHARE_BUCKET_S = 2.0
ENGINE = {
    **UNLIMITED,
    "INFERENCE_ENGINE": "simulated",
    "INFERENCE_MAX_NUM_SEQS": str(SLOTS),
    "VIP_RESERVED_SLOTS": str(VIP_RESERVED),
    "GENERATION_MAX_TOKENS": "256",
    "GENERATION_TIMEOUT_S": "600",
    # Every customer's answer is the model's (not the help center's own sentences, which need
    # no slot).
    "CHAT_ANSWER_STYLE": "generated",
    # Each customer comes from an address of their own (X-Forwarded-For, as from behind the
    # proxy): a guest's fair-share source is their address, and 20 guests of one address would
    # be one source beside the key.
    "TRUSTED_PROXIES": "127.0.0.1",
}
FLOOD = "api key"
# The phases: the customers alone (fair share as shipped), and beside the key with plain arrival
# order, with fair share waiting for a slot to turn over, and with fair share pausing the key's
# youngest answer when every slot is busy (`fair`: once per grace asked for, each a phase).
PHASES = ("alone", "fifo", "fair_wait", "fair")
FAIR = {"FAIR_SHARE": "true", "FAIR_SHARE_PREEMPTION": "true"}
FAIR_WAIT = {"FAIR_SHARE": "true", "FAIR_SHARE_PREEMPTION": "false"}
FIFO = {"FAIR_SHARE": "false"}


def _fair_phase(grace_s: float) -> str:
    """The name of the phase pausing the key's answers after `grace_s` (its key in the report)."""
    return f"flood_fair_{grace_s:g}s"


@dataclass
class Answer:
    source: str  # "chat-<n>" or FLOOD
    sent_at: float
    token_times: list[float] = field(default_factory=list)
    done: bool = False
    # As the answer's `done` event (chat) or usage chunk (API) reports it: its prompt as asked,
    # not what the engine prefilled again when the answer was paused and resumed.
    prompt_tokens: int | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.sent_at if self.token_times else None


def customer_address(n: int) -> str:
    """Customer n's address, in a documentation network (RFC 5737)."""
    return f"198.51.100.{n + 1}"


async def _customer(base_url: str, n: int, stop_at: float, answers: list[Answer]) -> None:
    """A guest asking, reading the answer to its end, thinking, asking again, in one
    conversation, until `stop_at`. The customers start spread over one think time: a steady
    pace, not a burst."""
    session = Session(base_url, forwarded_for=customer_address(n))
    try:
        conversation = await session.open_page()
        await asyncio.sleep(THINK_S * n / CUSTOMERS)
        turn = 0
        while time.perf_counter() < stop_at:
            answer = Answer(source=f"chat-{n}", sent_at=time.perf_counter())
            answers.append(answer)
            response = await session.post_message(conversation, question(n + turn))
            turn += 1
            if response.status != 202:
                raise RuntimeError(
                    f"a customer's message was refused: {response.status} {response.body[:200]!r}"
                )
            trace = await session.stream(response.json()["stream_url"], timeout_s=600)
            answer.token_times = trace.token_times
            answer.done = trace.outcome == "done"
            answer.prompt_tokens = trace.usage.prompt_tokens if trace.usage is not None else None
            await asyncio.sleep(THINK_S)
    finally:
        session.close()


async def _flood_stream(base_url: str, key: str, n: int, stop: asyncio.Event, answers: list[Answer]) -> None:
    """One of the key's open requests: a streamed completion of FLOOD_TOKENS tokens, then the
    next at once, until `stop`."""
    session = Session(base_url)
    body = {
        "model": "stable",
        "messages": [{"role": "user", "content": question(n)}],
        "stream": True,
        "max_tokens": FLOOD_TOKENS,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    while not stop.is_set():
        answer = Answer(source=FLOOD, sent_at=time.perf_counter())
        async with session.sse(
            "POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json_body=body
        ) as (response, events):
            if response.status != 200:
                raise RuntimeError(
                    f"the key's request was refused: {response.status} {response.body[:200]!r}"
                )
            answers.append(answer)
            async for event in events:
                if event.data == "[DONE]":
                    answer.done = True
                    break
                chunk = json.loads(event.data)
                if any(choice["delta"].get("content") for choice in chunk.get("choices", [])):
                    answer.token_times.append(time.perf_counter())
                if chunk.get("usage"):
                    answer.prompt_tokens = chunk["usage"]["prompt_tokens"]


async def _sampler(redis_url: str, samples: list[dict[str, float]]) -> None:
    """Every half second: the answers holding the worker's slots and those paused (its
    heartbeat), and the machine's CPU use. Slots kept full while tokens/s drops point at the
    CPU, not at the claim."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    psutil.cpu_percent()
    try:
        while True:
            await asyncio.sleep(0.5)
            beats = [
                await client.get(keys.worker_heartbeat(w))
                for w in await client.zrange(keys.WORKERS_INDEX, 0, -1)
            ]
            running = paused = 0
            for beat in filter(None, beats):
                running += json.loads(beat).get("running", 0)
                paused += json.loads(beat).get("paused", 0)
            samples.append({"running": running, "paused": paused, "cpu_percent": psutil.cpu_percent()})
    finally:
        await client.aclose()


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


async def _phase(base_url: str, redis_url: str, key: str | None, *, window_s: float) -> dict[str, Any]:
    """The customers for `window_s` (after the flood's warm-up, with `key`); the figures of the
    answers they asked for in the window and of every token delivered in it."""
    answers: list[Answer] = []
    samples: list[dict[str, float]] = []
    stop_flood = asyncio.Event()
    flood = []
    if key is not None:
        streams = FLOOD_FACTOR * (SLOTS - VIP_RESERVED)
        flood = [
            asyncio.create_task(_flood_stream(base_url, key, n, stop_flood, answers)) for n in range(streams)
        ]
        await asyncio.sleep(WARMUP_S)
    start = time.perf_counter()
    stop_at = start + window_s
    sampler = asyncio.create_task(_sampler(redis_url, samples))
    await asyncio.gather(*(_customer(base_url, n, stop_at, answers) for n in range(CUSTOMERS)))
    end = time.perf_counter()
    sampler.cancel()
    stop_flood.set()
    for task in flood:
        task.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    chat = [a for a in answers if a.source != FLOOD and a.sent_at < stop_at]
    flood_done = [a for a in answers if a.source == FLOOD and a.done and start <= a.token_times[-1] <= end]
    tokens = [(t, a.source) for a in answers for t in a.token_times if start <= t <= end]
    # Service as VTC counts it: each answer's prompt once, for the answers that ended in the
    # window, as their usage reports it (a resumed answer's prompt and streamed text prefilled
    # again are the engine's work, not service, and are not counted).
    ended = [a for a in answers if a.done and a.token_times and start <= a.token_times[-1] <= end]
    prompt_tokens = sum(a.prompt_tokens or 0 for a in ended)
    return {
        "window_s": end - start,
        "chat_ttft_s": distribution([a.ttft_s for a in chat if a.ttft_s is not None]),
        "chat_answers": sum(a.done for a in chat),
        "chat_unanswered": sum(not a.done for a in chat),
        "flood_answers": len(flood_done),
        "tokens_per_s": len(tokens) / (end - start),
        "chat_tokens_per_s": sum(source != FLOOD for _, source in tokens) / (end - start),
        "prompt_tokens_per_s": prompt_tokens / (end - start),
        "service_tokens_per_s": (prompt_tokens + len(tokens)) / (end - start),
        "answers_ended_without_usage": sum(a.prompt_tokens is None for a in ended),
        "chat_prompt_tokens_mean": _mean(
            [a.prompt_tokens for a in ended if a.source != FLOOD and a.prompt_tokens is not None]
        ),
        "flood_prompt_tokens_mean": _mean(
            [a.prompt_tokens for a in ended if a.source == FLOOD and a.prompt_tokens is not None]
        ),
        "shares": _shares(tokens, start, end),
        "slots_running_mean": _mean([sample["running"] for sample in samples]),
        "answers_paused_mean": _mean([sample["paused"] for sample in samples]),
        "cpu_percent_mean": _mean([sample["cpu_percent"] for sample in samples]),
    }


def _shares(tokens: list[tuple[float, str]], start: float, end: float) -> list[dict[str, Any]]:
    """Each source's share of the tokens delivered, per SHARE_BUCKET_S from the window's start."""
    buckets: list[dict[str, Any]] = []
    at = start
    while at < end:
        inside = [source for t, source in tokens if at <= t < at + SHARE_BUCKET_S]
        counts: dict[str, int] = {}
        for source in inside:
            counts[source] = counts.get(source, 0) + 1
        total = max(len(inside), 1)
        buckets.append({"t": at - start, "shares": {s: c / total for s, c in sorted(counts.items())}})
        at += SHARE_BUCKET_S
    return buckets


def _phase_stacks(phases: list[str], graces_s: list[float]) -> list[tuple[str, dict[str, str], bool]]:
    """Each phase of a run in order: its report key, its settings, whether the key floods."""
    stacks: list[tuple[str, dict[str, str], bool]] = []
    for phase in phases:
        if phase == "alone":
            stacks.append(("alone", {}, False))
        elif phase == "fifo":
            stacks.append(("flood_fifo", FIFO, True))
        elif phase == "fair_wait":
            stacks.append(("flood_fair_wait", FAIR_WAIT, True))
        elif phase == "fair":
            stacks += [
                (_fair_phase(grace), {**FAIR, "FAIR_SHARE_PREEMPT_AFTER_S": str(grace)}, True)
                for grace in graces_s
            ]
        else:
            raise ValueError(f"no phase {phase!r}: one of {', '.join(PHASES)}")
    return stacks


def fairness(*, runs: int, window_s: float, phases: list[str], graces_s: list[float]) -> dict[str, Any]:
    """`runs` runs of `phases` (in PHASES), `fair` once per grace in `graces_s`; each phase on
    a fresh stack."""
    stacks = _phase_stacks(phases, graces_s)
    report: dict[str, Any] = {
        "customers": CUSTOMERS,
        "think_s": THINK_S,
        "slots": SLOTS,
        "vip_reserved": VIP_RESERVED,
        "flood_streams": FLOOD_FACTOR * (SLOTS - VIP_RESERVED),
        "flood_tokens": FLOOD_TOKENS,
        "window_s": window_s,
        "fair_graces_s": graces_s if "fair" in phases else [],
        "runs": [],
    }
    for run in range(1, runs + 1):
        row: dict[str, Any] = {}
        for name, env, flood in stacks:
            with running({**ENGINE, **env}) as stack:
                key = stack.create_api_key("alice") if flood else None
                print(f"  run {run}: {name}", flush=True)
                row[name] = asyncio.run(_phase(stack.base_url, stack.redis.url, key, window_s=window_s))
        report["runs"].append(row)
    return report
