"""Arrival patterns (fixed concurrency, Poisson, burst) driving browser-like sessions."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable

from bench.client import Session
from bench.stats import RequestResult

DEMO_LOGINS = {"vip": ("victor", "victor-demo-pass"), "normal": ("alice", "alice-demo-pass")}


class SessionPool:
    """Browsers per tier, lent to one request at a time. Each tier's account signs in once
    (a password hash costs CPU) and its browsers share the session cookie, each with its
    own connection."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._free: dict[str, asyncio.Queue[Session]] = {}

    async def fill(self, tier: str, count: int) -> None:
        queue = self._free.setdefault(tier, asyncio.Queue())
        signed_in = Session(self.base_url)
        await signed_in.login(*DEMO_LOGINS[tier])
        signed_in.close()
        for _ in range(count):
            browser = Session(self.base_url)
            browser.cookies = dict(signed_in.cookies)
            queue.put_nowait(browser)

    async def borrow(self, tier: str) -> Session:
        return await self._free[tier].get()

    def give_back(self, tier: str, session: Session) -> None:
        self._free[tier].put_nowait(session)

    def close(self) -> None:
        for queue in self._free.values():
            while not queue.empty():
                queue.get_nowait().close()


class Progress:
    """One status line, rewritten every second, so long runs show they are alive."""

    def __init__(self, label: str, results: list[RequestResult], total: int | None = None) -> None:
        self.label = label
        self.results = results
        self.total = total
        self.started = time.perf_counter()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Progress:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        self._print()
        sys.stderr.write("\n")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(1)
            self._print()

    def _print(self) -> None:
        elapsed = time.perf_counter() - self.started
        done = sum(r.outcome == "done" for r in self.results)
        refused = sum(r.status in (429, 503) for r in self.results)
        tokens = sum(len(r.token_times) for r in self.results)
        of = f"/{self.total}" if self.total else ""
        sys.stderr.write(
            f"\r  {self.label}: {elapsed:6.1f}s  sent {len(self.results)}{of}  done {done}  "
            f"refused {refused}  tokens {tokens} ({tokens / max(elapsed, 1e-9):,.0f}/s)   "
        )
        sys.stderr.flush()


async def one_request(
    pool: SessionPool, tier: str, text: str, results: list[RequestResult], *, timeout_s: float
) -> RequestResult:
    session = await pool.borrow(tier)
    try:
        conversation = await session.new_conversation()
        result = RequestResult(tier=tier, submitted_at=time.perf_counter(), status=0)
        results.append(result)
        response = await session.post_message(conversation, text)
        result.posted_at = time.perf_counter()
        result.status = response.status
        if response.status != 202:
            result.finished_at = time.perf_counter()
            return result
        trace = await session.stream(response.json()["stream_url"], timeout_s=timeout_s)
        result.token_times = trace.token_times
        result.finished_at = trace.closed_at
        result.outcome = trace.outcome
        result.queue_s = trace.queue_s
        result.engine_ttft_s = trace.engine_ttft_s
        return result
    finally:
        pool.give_back(tier, session)


async def fixed_concurrency(
    pool: SessionPool,
    *,
    concurrency: int,
    requests: int,
    tier: str,
    prompt: Callable[[int], str],
    timeout_s: float,
    label: str,
) -> tuple[list[RequestResult], float]:
    results: list[RequestResult] = []
    counter = iter(range(requests))

    async def user() -> None:
        for n in counter:
            await one_request(pool, tier, prompt(n), results, timeout_s=timeout_s)

    started = time.perf_counter()
    async with Progress(label, results, requests):
        await asyncio.gather(*(user() for _ in range(concurrency)))
    return results, time.perf_counter() - started


async def poisson(
    pool: SessionPool,
    *,
    rate_per_s: float,
    duration_s: float,
    tier_of: Callable[[], str],
    prompt: Callable[[int], str],
    timeout_s: float,
    label: str,
    seed: int = 7,
) -> tuple[list[RequestResult], float]:
    rng = random.Random(seed)
    results: list[RequestResult] = []
    tasks: list[asyncio.Task[RequestResult]] = []
    started = time.perf_counter()
    async with Progress(label, results):
        n = 0
        next_at = started
        while next_at - started < duration_s:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            tasks.append(
                asyncio.create_task(one_request(pool, tier_of(), prompt(n), results, timeout_s=timeout_s))
            )
            n += 1
            next_at += rng.expovariate(rate_per_s)
        await asyncio.gather(*tasks)
    return results, time.perf_counter() - started


async def burst(
    pool: SessionPool, *, requests: int, tier: str, prompt: Callable[[int], str], timeout_s: float, label: str
) -> tuple[list[RequestResult], float]:
    results: list[RequestResult] = []
    started = time.perf_counter()
    async with Progress(label, results, requests):
        await asyncio.gather(
            *(one_request(pool, tier, prompt(n), results, timeout_s=timeout_s) for n in range(requests))
        )
    return results, time.perf_counter() - started


async def queue_requests(pool: SessionPool, count: int, text: str) -> list[tuple[Session, str]]:
    """Post `count` messages, 50 at a time; returns each browser with its stream's path."""

    async def submit() -> tuple[Session, str]:
        session = await pool.borrow("normal")
        conversation = await session.new_conversation()
        response = await session.post_message(conversation, text)
        session.close()  # the stream opens its own connection
        return session, response.json()["stream_url"]

    submitted: list[tuple[Session, str]] = []
    for start in range(0, count, 50):
        submitted += await asyncio.gather(*(submit() for _ in range(min(50, count - start))))
        print(f"\r  queued {len(submitted)}/{count}", end="", flush=True)
    print(flush=True)
    return submitted


def hello_counter(count: int) -> tuple[asyncio.Event, Callable[[], None]]:
    """An event set once `count` streams have sent their first status, and the callback."""
    all_open = asyncio.Event()
    said = 0

    def on_status() -> None:
        nonlocal said
        said += 1
        if said == count:
            all_open.set()

    return all_open, on_status


async def open_in_waves(count: int, open_one) -> list[asyncio.Task]:
    """Open `count` streams a few hundred at a time: a server's listen backlog drops a flood
    of simultaneous connects, and the client would wait out TCP's retransmission timers."""
    tasks: list[asyncio.Task] = []
    for start in range(0, count, 200):
        tasks += [asyncio.create_task(open_one(n)) for n in range(start, min(count, start + 200))]
        await asyncio.sleep(0.2)
    return tasks


async def until_all_said_hello(tasks: list[asyncio.Task], all_open: asyncio.Event) -> None:
    waiting = asyncio.create_task(all_open.wait())
    await asyncio.wait([waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if not all_open.is_set():
        raise RuntimeError(f"a stream ended before all were open: {[t.result() for t in tasks if t.done()]}")
