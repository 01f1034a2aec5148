"""The chaos soak: mixed traffic for minutes while parts of the product fail, counted exactly.

Browser chats (SSE, resumed with Last-Event-ID as EventSource does), OpenAI API calls (streamed
and whole) and batch jobs run against two inference workers on the simulated engine. Every
minute one worker is SIGKILLed and a new one started; Redis is restarted once and the web
process once. The simulated engine's answer is a known function of the question, so every
answer is checked word for word; chat tokens carry their position (`seq`, from 0 again after
a `reset`), so a token delivered twice or skipped is counted. Each process's memory is sampled
every few seconds.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis.asyncio as aioredis
from django.conf import settings

from bench.client import Response, Session, SseEvent
from bench.load import SessionPool
from inference.engines.base import GenerationRequest
from inference.engines.simulated import simulated_answer_tokens
from launcher.process import Process
from launcher.stack import Stack
from scheduler import keys
from scheduler.generation import AnswerFold, Done, event_decode

OUTPUT_TOKENS = 40
VARIANT = "stable"  # no canary split in the soak: every request is served by the stable variant
WORKER_KILL_EVERY_S = 60.0
MEMORY_SAMPLE_S = 5.0
PROGRESS_S = 10.0
# An accepted request's answer, however often its worker dies, ends within this (queue wait,
# lease expiry and reclaim, three attempts); past it the request counts as lost.
ANSWER_DEADLINE_S = 300.0
RECONNECT_S = 0.5  # a browser's EventSource retries after `retry:` (2 s); the bench a bit sooner
MAX_BACKOFF_S = 5.0
USERS = {"chat_normal": 4, "chat_vip": 2, "api_stream": 2, "api_whole": 2, "batch": 1}
BATCH_JOB_REQUESTS = 4

SOAK_ENV = {
    "INFERENCE_ENGINE": "simulated",
    "INFERENCE_MAX_NUM_SEQS": "8",
    "VIP_RESERVED_SLOTS": "2",
    "SIMULATED_OUTPUT_TOKENS": str(OUTPUT_TOKENS),
    "SIMULATED_DECODE_BASE_S": "0.03",
    # Two demo accounts carry every chat: their own buckets and concurrency out of the way, the
    # queue bounds, wait SLOs and the global bucket as shipped.
    **{f"RATE_LIMIT_{t}_CAPACITY": "100000" for t in ("VIP", "NORMAL")},
    **{f"RATE_LIMIT_{t}_REFILL_PER_S": "10000" for t in ("VIP", "NORMAL")},
    **{f"MAX_CONCURRENT_{t}": "100000" for t in ("VIP", "NORMAL")},
    # ... and their streams, all from one address.
    "STREAMS_MAX_PER_CLIENT": "100000",
    "STREAMS_MAX_PER_ADDRESS": "100000",
    # A killed worker's jobs are reclaimed after the lease: short, so the soak sees many cycles.
    "JOB_LEASE_S": "5",
    "WORKER_HEARTBEAT_S": "0.5",
    "WORKER_HEARTBEAT_TTL_S": "3",
    "BATCH_JOB_LEASE_S": "5",
    "BATCH_JOB_RESUME_S": "2",
    "BATCH_JOB_SLICE_S": "20",
    "LOG_LEVEL": "WARNING",
}
TOPICS = ["my order", "a refund", "shipping to Canada", "my password", "the opening hours", "an invoice"]


def expected_answer(question: str) -> str:
    request = GenerationRequest(request_id="", messages=[{"role": "user", "content": question}])
    return "".join(simulated_answer_tokens(request, OUTPUT_TOKENS))


@dataclass
class Answer:
    """One request as its client saw it. `outcome`: pending while unanswered, then done,
    error:<code> (an answer that ended with an error the client was told), cut (the web
    process went away under an API call: the client sees a failed call), or lost."""

    kind: str
    question: str
    request_id: str | None = None
    outcome: str = "pending"
    text: str = ""
    fold: AnswerFold = field(default_factory=AnswerFold)  # chat: the stream's events
    reconnects: int = 0

    @property
    def duplicated_tokens(self) -> int:
        return self.fold.repeated

    @property
    def skipped_tokens(self) -> int:
        return self.fold.skipped

    @property
    def resets(self) -> int:
        return self.fold.resets


@dataclass
class Tally:
    started: float = field(default_factory=time.perf_counter)
    answers: list[Answer] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)  # "<kind> <status> <code>"
    unreachable: Counter[str] = field(default_factory=Counter)  # submissions the web never took
    events: list[tuple[float, str]] = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.started

    def event(self, label: str) -> None:
        self.events.append((self.now(), label))
        print(f"  [{self.now():6.1f}s] {label}", flush=True)

    def refused(self, kind: str, response: Response) -> float:
        """Count a refusal; returns how long to back off (its Retry-After, bounded)."""
        try:
            code = json.loads(response.body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = "-"
        self.refusals[f"{kind} {response.status} {code}"] += 1
        return min(float(response.headers.get("retry-after", 1)), MAX_BACKOFF_S)


# --- the four kinds of client -----------------------------------------------------------------


async def _chat(pool: SessionPool, tier: str, question: str, tally: Tally) -> float:
    session = await pool.borrow(tier)
    try:
        session.close()  # a fresh connection: a POST is never sent twice
        conversation = await session.new_conversation()
        response = await session.post_message(conversation, question)
        if response.status != 202:
            return tally.refused(f"chat_{tier}", response)
        answer = Answer(kind=f"chat_{tier}", question=question, request_id=response.json()["request_id"])
        tally.answers.append(answer)
        await _follow_chat(session, response.json()["stream_url"], answer)
        return 0.0
    finally:
        pool.give_back(tier, session)


async def _follow_chat(session: Session, path: str, answer: Answer) -> None:
    """Follow the stream to its end, reconnecting with Last-Event-ID whenever it breaks."""
    last_id: str | None = None
    deadline = time.monotonic() + ANSWER_DEADLINE_S
    while time.monotonic() < deadline:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        try:
            async with (
                asyncio.timeout(deadline - time.monotonic()),
                session.sse("GET", path, headers=headers) as (response, events),
            ):
                if response.status == 200:
                    async for event in events:
                        last_id = event.id or last_id
                        if _chat_event(answer, event):
                            return
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        answer.reconnects += 1
        await asyncio.sleep(RECONNECT_S)


def _chat_event(answer: Answer, event: SseEvent) -> bool:
    """Apply one event; True when the answer has ended."""
    if event.event == "status":
        return False  # the relay's own; the rest are result events
    answer.fold.add(event_decode(event.event, json.loads(event.data)))
    end = answer.fold.end
    if end is None:
        return False
    answer.text = answer.fold.text
    answer.outcome = "done" if isinstance(end, Done) else f"error:{end.code}"
    return True


def _request_id(completion_id: str) -> str:
    """The request id inside an OpenAI completion id (`chatcmpl-<hex>`)."""
    return str(uuid.UUID(completion_id.removeprefix("chatcmpl-")))


def _api_request(question: str, *, stream: bool) -> dict[str, Any]:
    return {"model": VARIANT, "messages": [{"role": "user", "content": question}], "stream": stream}


async def _api_stream(session: Session, key: str, question: str, tally: Tally) -> float:
    headers = {"Authorization": f"Bearer {key}"}
    answer = Answer(kind="api_stream", question=question)
    parts: list[str] = []
    finished = False
    try:
        async with (
            asyncio.timeout(ANSWER_DEADLINE_S),
            session.sse(
                "POST", "/v1/chat/completions", headers=headers, json_body=_api_request(question, stream=True)
            ) as (response, events),
        ):
            if response.status != 200:
                return tally.refused("api_stream", response)
            tally.answers.append(answer)
            async for event in events:
                if event.data == "[DONE]":
                    finished = True
                    break
                chunk = json.loads(event.data)
                if "error" in chunk:
                    answer.outcome = f"error:{chunk['error']['code']}"
                    return 0.0
                answer.request_id = answer.request_id or _request_id(chunk["id"])
                for choice in chunk["choices"]:
                    parts.append(choice["delta"].get("content") or "")
            answer.text = "".join(parts)
            answer.outcome = "done" if finished else "cut"
    except (ConnectionError, asyncio.IncompleteReadError):
        if answer not in tally.answers:
            raise  # not taken: the web process is away
        answer.outcome = "cut"
    except TimeoutError:
        answer.outcome = "lost"
    return 0.0


async def _api_whole(session: Session, key: str, question: str, tally: Tally) -> float:
    headers = {"Authorization": f"Bearer {key}"}
    answer = Answer(kind="api_whole", question=question)
    tally.answers.append(answer)  # whether it was accepted shows only in the response
    try:
        async with asyncio.timeout(ANSWER_DEADLINE_S):
            session.close()
            response = await session.request(
                "POST",
                "/v1/chat/completions",
                json_body=_api_request(question, stream=False),
                headers=headers,
            )
    except ConnectionRefusedError:
        tally.answers.remove(answer)
        raise  # not taken: the web process is away
    except (ConnectionError, asyncio.IncompleteReadError):
        answer.outcome = "cut"
        return 0.0
    except TimeoutError:
        answer.outcome = "lost"
        return 0.0
    try:
        body = response.json()
    except ValueError:
        body = {"error": {"code": f"http_{response.status}"}}
    if response.status == 200:
        answer.request_id = _request_id(body["id"])
        answer.text = body["choices"][0]["message"]["content"]
        answer.outcome = "done"
        return 0.0
    code = body["error"]["code"]
    if response.status in (429, 503) and code not in ("expired",):
        tally.answers.remove(answer)
        return tally.refused("api_whole", response)
    answer.outcome = f"error:{code}"
    return 0.0


async def _batch_job(session: Session, key: str, question: str, tally: Tally) -> float:
    headers = {"Authorization": f"Bearer {key}"}
    questions = [f"{question} (part {n})" for n in range(BATCH_JOB_REQUESTS)]
    session.close()
    response = await session.request(
        "POST",
        "/v1/jobs",
        json_body={"requests": [_api_request(q, stream=False) for q in questions]},
        headers=headers,
    )
    if response.status != 202:
        return tally.refused("batch", response)
    answers = [Answer(kind="batch", question=q) for q in questions]
    tally.answers += answers
    deadline = time.monotonic() + ANSWER_DEADLINE_S
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        try:
            poll = await session.request("GET", f"/v1/jobs/{response.json()['id']}", headers=headers)
        except (ConnectionError, asyncio.IncompleteReadError):
            continue  # the web process is restarting: the job carries on without us
        job = poll.json()
        if job["status"] not in ("queued", "running"):
            for answer, result in zip(answers, job["results"], strict=True):
                if result["status"] == "completed":
                    answer.request_id = _request_id(result["response"]["id"])
                    answer.text = result["response"]["choices"][0]["message"]["content"]
                    answer.outcome = "done"
                else:
                    answer.outcome = f"error:{(result['error'] or {}).get('code')}"
            return 0.0
    for answer in answers:
        answer.outcome = "lost"
    return 0.0


async def _user(
    kind: str, tally: Tally, until: float, ask: Callable[[str], Coroutine[Any, Any, float]], seed: int
) -> None:
    """One client: ask, wait for the answer, pause a moment, again, until the run ends. A
    refusal waits out its Retry-After; a web process that is away is tried again shortly."""
    rng = random.Random(seed)
    n = 0
    while time.perf_counter() < until:
        n += 1
        question = f"Question {seed}-{n} about {rng.choice(TOPICS)}?"
        try:
            backoff = await ask(question)
        except (ConnectionError, asyncio.IncompleteReadError):
            tally.unreachable[kind] += 1
            backoff = 1.0
        await asyncio.sleep(backoff + rng.uniform(0.2, 1.0))


# --- chaos and memory ---------------------------------------------------------------------------


def _rss_mb(process: Process | None) -> float | None:
    if process is None or not process.running():
        return None
    try:
        leader = psutil.Process(process.pid)
        return sum(p.memory_info().rss for p in [leader, *leader.children(recursive=True)]) / 2**20
    except psutil.NoSuchProcess:
        return None


async def _sample_memory(stack: Stack, tally: Tally, samples: dict[str, list[tuple[float, float]]]) -> None:
    """RSS of each process (with its children: Celery's beat) by "<role> <pid>"."""
    while True:
        for process in [stack.web, *stack.workers, *stack.celery_workers, stack.redis.process]:
            rss = _rss_mb(process)
            if process is not None and rss is not None:
                samples.setdefault(f"{process.name} {process.pid}", []).append((tally.now(), rss))
        await asyncio.sleep(MEMORY_SAMPLE_S)


async def _chaos(stack: Stack, tally: Tally, duration_s: float) -> None:
    """Kill a worker every minute (the first half a minute in), Redis at half time, web at 80%."""
    plan: list[tuple[float, str]] = []
    at = WORKER_KILL_EVERY_S / 2
    while at < duration_s:
        plan.append((at, "kill worker"))
        at += WORKER_KILL_EVERY_S
    plan += [(duration_s * 0.5, "restart redis"), (duration_s * 0.8, "restart web")]
    for at, action in sorted(plan):
        await asyncio.sleep(max(0.0, at - tally.now()))
        if action == "kill worker":
            # The oldest of the two: a replacement joins the end of the list.
            victim = stack.workers[0]
            stack.kill_worker(victim)
            tally.event(f"SIGKILL worker pid {victim.pid}; starting another")
            await asyncio.to_thread(stack.start_worker)
            action = f"worker pid {stack.workers[-1].pid} started"
        elif action == "restart redis":
            tally.event("restarting Redis (down 1 s)")
            await asyncio.to_thread(stack.redis.restart, 1.0)
        else:
            tally.event("restarting the web process")
            await asyncio.to_thread(stack.restart_web)
        tally.event(f"{action}: done" if action.startswith("restart") else action)


async def _progress(tally: Tally) -> None:
    while True:
        await asyncio.sleep(PROGRESS_S)
        outcomes = Counter(a.outcome.split(":")[0] for a in tally.answers)
        print(
            f"  [{tally.now():6.1f}s] accepted {len(tally.answers)}  done {outcomes['done']}  "
            f"in flight {outcomes['pending']}  errors {outcomes['error']}  cut {outcomes['cut']}  "
            f"refused {sum(tally.refusals.values())}  unreachable {sum(tally.unreachable.values())}",
            flush=True,
        )


# --- the run --------------------------------------------------------------------------------------


async def _unanswered_in_redis(redis_url: str, answers: list[Answer]) -> int:
    """Of the given answers with a request id, how many have no done/error in their result
    stream: the server side of "lost"."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        missing = 0
        for answer in answers:
            if answer.request_id is None:
                continue
            events = await client.xrange(keys.result(settings.INFERENCE_MODEL_NAME, answer.request_id))
            if not any(fields["type"] in ("done", "error") for _, fields in events):
                missing += 1
        return missing
    finally:
        await client.aclose()


def _summary(tally: Tally, samples: dict[str, list[tuple[float, float]]], duration_s: float) -> dict:
    kinds = sorted({a.kind for a in tally.answers})

    def block(answers: list[Answer]) -> dict:
        done = [a for a in answers if a.outcome == "done"]
        return {
            "accepted": len(answers),
            "completed": len(done),
            "errors": dict(Counter(a.outcome for a in answers if a.outcome.startswith("error:"))),
            "cut": sum(a.outcome == "cut" for a in answers),
            "lost": sum(a.outcome in ("lost", "pending") for a in answers),
            "duplicated_tokens": sum(a.duplicated_tokens for a in answers),
            "skipped_tokens": sum(a.skipped_tokens for a in answers),
            "wrong_answers": sum(a.text != expected_answer(a.question) for a in done),
            "resets": sum(a.resets for a in answers),
            "reconnects": sum(a.reconnects for a in answers),
        }

    memory = {}
    for role, series in samples.items():
        half = [rss for t, rss in series if t >= duration_s / 2]
        memory[role] = {
            "start_mb": series[0][1],
            "end_mb": series[-1][1],
            "peak_mb": max(rss for _, rss in series),
            "second_half_growth_mb": half[-1] - half[0] if len(half) > 1 else None,
            "samples": series,
        }
    anomalies = [
        {
            "kind": a.kind,
            "request_id": a.request_id,
            "outcome": a.outcome,
            "duplicated_tokens": a.duplicated_tokens,
            "skipped_tokens": a.skipped_tokens,
            "wrong_answer": a.outcome == "done" and a.text != expected_answer(a.question),
            "resets": a.resets,
            "reconnects": a.reconnects,
        }
        for a in tally.answers
        if a.outcome != "done"
        or a.duplicated_tokens
        or a.skipped_tokens
        or a.text != expected_answer(a.question)
    ]
    return {
        "duration_s": duration_s,
        "users": USERS,
        "anomalies": anomalies,
        "output_tokens": OUTPUT_TOKENS,
        "all": block(tally.answers),
        "per_kind": {kind: block([a for a in tally.answers if a.kind == kind]) for kind in kinds},
        "refusals": dict(tally.refusals),
        "unreachable": dict(tally.unreachable),
        "chaos": tally.events,
        "memory": memory,
    }


def soak(*, duration_s: float) -> dict:
    stack = Stack(Path(tempfile.mkdtemp(prefix="bench-soak-")), **SOAK_ENV)
    print(f"  starting the product (two workers, Celery; logs in {stack.workdir})...", flush=True)
    stack.start()
    try:
        stack.start_worker()
        stack.start_celery()
        keys_by_tier = {"normal": stack.create_api_key("alice"), "vip": stack.create_api_key("victor")}
        tally = Tally()
        samples: dict[str, list[tuple[float, float]]] = {}

        async def main() -> None:
            pool = SessionPool(stack.base_url)
            await pool.fill("normal", USERS["chat_normal"])
            await pool.fill("vip", USERS["chat_vip"])
            until = time.perf_counter() + duration_s
            users = []
            for n in range(USERS["chat_normal"]):
                users.append(_user("chat_normal", tally, until, lambda q: _chat(pool, "normal", q, tally), n))
            for n in range(USERS["chat_vip"]):
                users.append(_user("chat_vip", tally, until, lambda q: _chat(pool, "vip", q, tally), 100 + n))
            for kind, ask, count in (
                ("api_stream", _api_stream, USERS["api_stream"]),
                ("api_whole", _api_whole, USERS["api_whole"]),
                ("batch", _batch_job, USERS["batch"]),
            ):
                for n in range(count):
                    session = Session(stack.base_url)
                    key = keys_by_tier["vip" if n % 2 else "normal"]

                    def asker(q: str, ask=ask, session=session, key=key) -> Coroutine[Any, Any, float]:
                        return ask(session, key, q, tally)

                    users.append(_user(kind, tally, until, asker, 200 + 100 * len(users) + n))
            background = [
                asyncio.create_task(_sample_memory(stack, tally, samples)),
                asyncio.create_task(_progress(tally)),
            ]
            chaos = asyncio.create_task(_chaos(stack, tally, duration_s))
            await asyncio.gather(*users)
            tally.event("traffic stopped; waiting for the answers in flight")
            await chaos
            for task in background:
                task.cancel()
            pool.close()

        asyncio.run(main())
        # Anything not answered by its client: did the product finish it (a cut API call) or
        # is it lost? The result streams are the record.
        unanswered = [a for a in tally.answers if a.outcome in ("pending", "lost", "cut")]
        server_unanswered = asyncio.run(_unanswered_in_redis(stack.redis.url, unanswered))
    finally:
        stack.stop()
    report = _summary(tally, samples, duration_s)
    report["all"]["unanswered_in_result_streams"] = server_unanswered
    return report
