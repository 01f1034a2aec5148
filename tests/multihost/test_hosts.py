"""The product on several hosts (tests/multihost/topology.py): a host dies, the rest carry on.

The scenarios share one topology and run in order; each restores what it broke, except the
Redis failover, which comes last.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime

import httpx
import psycopg
import pytest
import redis

from launcher.process import ROOT
from scheduler.generation import AnswerFold, Reset, Token, event_decode
from tests.e2e.client import ChatClient, static_links
from tests.multihost.topology import MASTER_NAME, MultiHost

pytestmark = pytest.mark.multihost

DEADLINE_S = 90.0


@dataclass
class Followed:
    """What an EventSource through nginx saw of one answer, across reconnects."""

    request_id: str
    answer: AnswerFold = field(default_factory=AnswerFold)
    tokens: int = 0  # token events read since the last reset, repeats included
    last_id: str | None = None
    dropped_at: float | None = None  # when the first connection ended early
    resumed_at: float | None = None  # first token after the first drop

    @property
    def terminal(self) -> str | None:
        return None if self.answer.end is None else self.answer.end.type


async def _follow(client: ChatClient, followed: Followed) -> None:
    """Read the stream to its end, reconnecting with Last-Event-ID whenever the connection ends
    early, as a browser's EventSource does. Like an EventSource it waits for ever for the next
    byte: a stream that went silent must be ended by the server side."""
    while followed.terminal is None:
        headers = {"Accept": "text/event-stream"}
        if followed.last_id is not None:
            headers["Last-Event-ID"] = followed.last_id
        try:
            async with (
                httpx.AsyncClient(
                    base_url=client.http.base_url,
                    cookies=client.http.cookies,
                    timeout=httpx.Timeout(30, read=None),
                ) as http,
                http.stream("GET", f"/chat/stream/{followed.request_id}", headers=headers) as response,
            ):
                if response.status_code != 200:
                    raise httpx.TransportError(f"stream answered {response.status_code}")
                fields: dict[str, str] = {}
                async for line in response.aiter_lines():
                    if line == "":
                        _take(followed, fields)
                        fields = {}
                        if followed.terminal is not None:
                            return
                    elif not line.startswith(":"):
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
        except httpx.TransportError:
            pass
        if followed.dropped_at is None:
            followed.dropped_at = time.monotonic()
        await asyncio.sleep(0.05)  # an EventSource's retry delay, shortened


def _take(followed: Followed, fields: dict[str, str]) -> None:
    if "event" not in fields:
        return
    followed.last_id = fields.get("id", followed.last_id)
    if fields["event"] == "status":
        return  # the relay's own; the rest are result events
    body = event_decode(fields["event"], json.loads(fields["data"]))
    followed.answer.add(body)
    if isinstance(body, Token):
        followed.tokens += 1
        if followed.dropped_at is not None and followed.resumed_at is None:
            followed.resumed_at = time.monotonic()
    elif isinstance(body, Reset):
        followed.tokens = 0


async def _ask(hosts: MultiHost, count: int) -> list[tuple[ChatClient, str]]:
    """`count` guests each ask one question through nginx; returns (client, request_id)."""
    asked = []
    for n in range(count):
        client = ChatClient(hosts.base_url, timeout_s=30)
        conversation = await client.open_page()
        asked.append((client, await client.ask(conversation, f"Where is my order number {n}?")))
    return asked


def _stored(hosts: MultiHost, request_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
    """(status, content) of each request's stored answers, read from PostgreSQL."""
    with psycopg.connect(hosts.database_url) as db:
        rows = db.execute(
            "SELECT m.request_id::text, g.status, g.text FROM chat_message m"
            " JOIN scheduler_generation g ON g.request_id = m.request_id"
            " WHERE m.request_id = ANY(%s::uuid[])",
            (request_ids,),
        ).fetchall()
    stored: dict[str, list[tuple[str, str]]] = {rid: [] for rid in request_ids}
    for request_id, status, content in rows:
        stored[request_id].append((status, content))
    return stored


async def _until(condition, what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
        await asyncio.sleep(0.05)


def test_the_chat_page_loads_its_styles_and_scripts_through_nginx(hosts):
    with httpx.Client(base_url=hosts.base_url, timeout=10) as browser:
        page = browser.get("/")
        assert page.status_code == 200
        links = static_links(page.text)
        assert {"/static/chat/chat.css", "/static/chat/chat.js", "/static/vendor/htmx.min.js"} <= set(links)
        for link in links:
            response = browser.get(link)
            assert response.status_code == 200, link
            assert response.content == (ROOT / "static" / link.removeprefix("/static/")).read_bytes(), link


def _beat_sends(hosts: MultiHost, task: str) -> list[tuple[datetime, str]]:
    """(when, by which Celery host) each time a beat sent `task`, in order, from their logs."""
    sends = []
    for host in ("celery1", "celery2"):
        for line in hosts.log(host).read_text().splitlines():
            if f"Sending due task {task} " in line:
                stamp = re.match(r"\[(\S+ \S+): ", line).group(1)
                sends.append((datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f"), host))
    return sorted(sends)


def test_two_beats_send_each_periodic_task_once_a_period_and_on_when_one_host_dies(hosts):
    """Both Celery hosts run beat; canary-evaluate (every 2 s) is sent by one of them each
    period, never twice and never missed, also across the death of the host that sent it."""
    period_s, tolerance_s = 2.0, 0.2  # CANARY_EVALUATION_S; config.beat allows a tenth of it

    def sends() -> list[tuple[datetime, str]]:
        return _beat_sends(hosts, "canary-evaluate")

    deadline = time.monotonic() + DEADLINE_S
    while len(sends()) < 4:
        assert time.monotonic() < deadline, "four sends"
        time.sleep(0.05)
    seen = len(sends())
    while len(sends()) == seen:  # a send just now: its host dies before the next
        assert time.monotonic() < deadline, "a send"
        time.sleep(0.02)
    dead = sends()[-1][1]
    hosts.kill(dead)
    try:
        killed = len(sends())
        while len(sends()) < killed + 3:
            assert time.monotonic() < deadline, "three sends after a Celery host died"
            time.sleep(0.2)
        times = [when for when, _ in sends()]
        gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)]
        assert min(gaps) >= period_s - tolerance_s, f"sent twice in a period: gaps {gaps}"
        assert max(gaps) <= period_s + tolerance_s, f"a period without a send: gaps {gaps}"
        assert {host for _, host in sends()[killed:]} == {"celery1", "celery2"} - {dead}
        print(f"\n{dead} died after sending: the other beat sent {gaps[killed - 1]:.2f} s after it")
    finally:
        hosts.start_celery(dead)


def test_a_web_host_vanishes_mid_answer_and_its_streams_resume_exactly_on_the_other(hosts):
    """web1 drops off the network with ten answers streaming through nginx: nothing closes its
    connections, so nginx must find its streams silent (three heartbeats) and end them."""

    async def scenario() -> None:
        asked = await _ask(hosts, 10)
        followed = [Followed(request_id) for _, request_id in asked]
        readers = [
            asyncio.create_task(_follow(client, f)) for (client, _), f in zip(asked, followed, strict=True)
        ]
        await _until(lambda: all(f.tokens >= 5 for f in followed), "every answer streaming")
        unplugged_at = time.monotonic()
        hosts.unplug("web1")
        _, hanging = await asyncio.wait(readers, timeout=DEADLINE_S)
        for reader in hanging:
            reader.cancel()
        assert not hanging, f"{len(hanging)} streams still hang {DEADLINE_S} s after their web host vanished"
        for client, _ in asked:
            await client.http.aclose()

        dropped = [f for f in followed if f.dropped_at is not None]
        assert dropped, "no stream went through the web host that vanished"
        stored = _stored(hosts, [f.request_id for f in followed])
        for f in followed:
            assert f.terminal == "done"
            fold = f.answer
            assert (fold.resets, fold.repeated, fold.skipped) == (0, 0, 0), f"{f.request_id} not exact"
            assert stored[f.request_id] == [("done", fold.text)]
        ended_s = max(f.dropped_at - unplugged_at for f in dropped)
        flowing_again_s = max(f.resumed_at - unplugged_at for f in dropped)
        print(
            f"\nweb host unplugged: {len(dropped)} of {len(followed)} streams moved to the other web host; "
            f"nginx ended the last of them {ended_s:.2f} s and all flowed again {flowing_again_s:.2f} s "
            "after the host vanished"
        )

    try:
        asyncio.run(scenario())
    finally:
        hosts.kill("web1")
        hosts.plug("web1")
        hosts.start_web("web1")
        hosts.wait_ready()


def test_a_worker_host_dies_mid_answer_and_the_other_finishes_its_jobs_once(hosts):
    async def scenario() -> None:
        # Six slots per worker: twelve answers keep both busy.
        asked = await _ask(hosts, 12)
        followed = [Followed(request_id) for _, request_id in asked]
        readers = [
            asyncio.create_task(_follow(client, f)) for (client, _), f in zip(asked, followed, strict=True)
        ]
        await _until(lambda: all(f.tokens >= 3 for f in followed), "every answer streaming")
        hosts.kill("worker1")
        await asyncio.wait_for(asyncio.gather(*readers), DEADLINE_S)
        for client, _ in asked:
            await client.http.aclose()
        stored = _stored(hosts, [f.request_id for f in followed])
        for f in followed:
            assert f.terminal == "done"
            assert stored[f.request_id] == [("done", f.answer.text)], "stored once, as streamed"

    try:
        asyncio.run(scenario())
    finally:
        hosts.start_worker("worker1")


def test_the_redis_primary_dies_after_a_burst_and_every_accepted_request_completes(hosts):
    primary = redis.Redis(host=hosts.address("redis1"), port=6379)
    print(f"\nWAIT for the replica costs {_wait_cost_ms(primary):.3f} ms per submission (p50)")

    async def burst() -> list[str]:
        asked = await _ask(hosts, 20)
        for client, _ in asked:
            await client.http.aclose()
        return [request_id for _, request_id in asked]

    request_ids = asyncio.run(burst())  # every one a 202
    killed_at = time.monotonic()
    hosts.redis["redis1"].kill()

    sentinel = redis.Redis(host=hosts.address("sentinel1"), port=26379, decode_responses=True)
    deadline = time.monotonic() + DEADLINE_S
    while sentinel.sentinel_get_master_addr_by_name(MASTER_NAME)[0] != hosts.address("redis2"):
        assert time.monotonic() < deadline, "Sentinel did not promote the replica"
        time.sleep(0.05)
    promoted_s = time.monotonic() - killed_at

    def answered() -> bool:
        return all(
            status != "pending" for answers in _stored(hosts, request_ids).values() for status, _ in answers
        )

    while not answered():
        assert time.monotonic() < deadline, "accepted requests still unanswered"
        time.sleep(0.2)
    answered_s = time.monotonic() - killed_at
    for request_id, answers in _stored(hosts, request_ids).items():
        assert len(answers) == 1 and answers[0][0] == "done" and answers[0][1], f"{request_id}: {answers}"
    print(
        f"primary killed: replica promoted after {promoted_s:.2f} s; "
        f"all {len(request_ids)} accepted requests answered {answered_s:.2f} s after the kill"
    )


def _wait_cost_ms(primary: redis.Redis, rounds: int = 300) -> float:
    """What WAIT 1 adds to a write's round trip, as the enqueue pipelines them."""

    def round_trip_ms(wait: bool) -> float:
        samples = []
        for _ in range(rounds):
            pipe = primary.pipeline(transaction=False)
            pipe.xadd("llm:bench:wait", {"f": "v"}, maxlen=100)
            if wait:
                pipe.wait(1, 1000)
            started = time.perf_counter()
            pipe.execute()
            samples.append((time.perf_counter() - started) * 1000)
        return statistics.median(samples)

    cost = round_trip_ms(True) - round_trip_ms(False)
    primary.delete("llm:bench:wait")
    return cost
