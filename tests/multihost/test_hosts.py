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

from scheduler.generation import AnswerFold, Reset, Token, event_decode
from tests.e2e.client import ChatClient, chat_page_assets_check
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


async def _ask(
    hosts: MultiHost, count: int, *, base_url: str | None = None, retry_unavailable: bool = False
) -> list[tuple[ChatClient, str]]:
    """`count` guests each ask one question, through nginx unless given a web host's URL;
    returns (client, request_id). With `retry_unavailable` a 503 is asked again after its
    Retry-After, as a customer would."""
    asked = []
    for n in range(count):
        client = ChatClient(base_url or hosts.base_url, timeout_s=30)
        conversation = await client.open_page()
        deadline = time.monotonic() + DEADLINE_S
        response = await client.post_message(conversation, f"Where is my order number {n}?")
        while retry_unavailable and response.status_code == 503 and time.monotonic() < deadline:
            await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
            response = await client.post_message(conversation, f"Where is my order number {n}?")
        assert response.status_code == 202, f"{response.status_code}: {response.text}"
        asked.append((client, response.json()["request_id"]))
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
    chat_page_assets_check(hosts.base_url)


def _celery_logged(hosts: MultiHost, pattern: str) -> list[tuple[datetime, str]]:
    """(when, on which host) the Celery hosts logged a line matching `pattern`, in order."""
    logged = []
    for host in ("celery1", "celery2"):
        for line in hosts.log(host).read_text().splitlines():
            if re.search(pattern, line):
                stamp = re.match(r"\[(\S+ \S+): ", line).group(1)
                logged.append((datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f"), host))
    return sorted(logged)


def test_two_beats_send_each_periodic_task_once_a_period_and_on_when_one_host_dies(hosts, measured):
    """Both Celery hosts run beat; canary-evaluate (every 2 s) is sent by one of them each
    period, never twice and never missed, also across the death of the host that sent it."""
    period_s, tolerance_s = 2.0, 0.2  # CANARY_EVALUATION_S; config.beat allows a tenth of it

    def sends() -> list[tuple[datetime, str]]:
        return _celery_logged(hosts, r"Sending due task canary-evaluate ")

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
        measured.append(
            f"Celery host that sent canary-evaluate killed: the other beat sent it {gaps[killed - 1]:.2f} s "
            f"after the last send (period {period_s:g} s; gaps {min(gaps):.2f} to {max(gaps):.2f} s)"
        )
    finally:
        hosts.start_celery(dead)


def test_a_web_host_vanishes_mid_answer_and_its_streams_resume_exactly_on_the_other(hosts, measured):
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
        measured.append(
            f"web host unplugged: {len(dropped)} of {len(followed)} streams were on it; nginx ended the last "
            f"of them {ended_s:.2f} s after, and all flowed again through the other {flowing_again_s:.2f} s "
            f"after (nginx's stream read timeout: three {hosts.settings_env['SSE_HEARTBEAT_S']} s heartbeats)"
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


def test_the_redis_primary_dies_and_every_request_accepted_with_wait_completes(hosts, measured):
    """web1 accepts a submission once a replica has it (REDIS_WAIT_REPLICAS=1), web2 is given
    REDIS_WAIT_REPLICAS=0. Twenty requests are accepted through web1; then what the primary sends
    the replica is lost on the way, and three submissions go to each web host before the primary
    dies: web1 refuses its three (503), web2 accepts its three, which the promoted replica never
    had. The twenty are all answered; afterwards a new question through nginx is answered and
    streamed, and Celery's periodic task runs again, all on the new primary."""
    hosts.stop_process("web2")
    hosts.start_web("web2", REDIS_WAIT_REPLICAS="0")
    hosts.wait_ready()
    web1, web2 = hosts.web_url("web1"), hosts.web_url("web2")
    with_wait_ms, without_wait_ms = asyncio.run(_submission_ms(with_wait=web1, without_wait=web2))
    measured.append(
        f"a question's POST to a web host (p50 of 40): {with_wait_ms:.2f} ms with WAIT, "
        f"{without_wait_ms:.2f} ms without; on Redis alone WAIT adds "
        f"{_wait_cost_ms(hosts.redis_client('redis1')):.3f} ms (p50 of 300)"
    )

    async def burst_then_cut() -> tuple[list[str], list[int], list[str]]:
        asked = await _ask(hosts, 20, base_url=web1)
        hosts.cut("redis1", "redis2")  # the replica hears nothing more from the primary
        refused, accepted = await asyncio.gather(_post(web1, 3), _post(web2, 3))
        for client, _ in asked:
            await client.http.aclose()
        return [request_id for _, request_id in asked], [status for status, _ in refused], accepted

    request_ids, refused, accepted = asyncio.run(burst_then_cut())
    primary, replica = hosts.redis_client("redis1"), hosts.redis_client("redis2")
    accepted_ids = [request_id for status, request_id in accepted if status == 202]
    assert refused == [503, 503, 503], "with WAIT, a submission the replica did not confirm is refused"
    assert len(accepted_ids) == 3, f"without WAIT, the primary alone accepts: {accepted}"
    assert all(_in_redis(primary, rid) and not _in_redis(replica, rid) for rid in accepted_ids)
    killed_at = time.monotonic()
    hosts.redis["redis1"].kill()

    sentinel = hosts.redis_client("sentinel1")
    deadline = time.monotonic() + DEADLINE_S
    while sentinel.sentinel_get_master_addr_by_name(MASTER_NAME)[0] != hosts.address("redis2"):
        assert time.monotonic() < deadline, "Sentinel did not promote the replica"
        time.sleep(0.05)
    promoted_s = time.monotonic() - killed_at
    promoted_at = datetime.now()

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
    assert not any(_in_redis(replica, rid) for rid in accepted_ids), "lost: accepted without WAIT"
    never_answered = {status for answers in _stored(hosts, accepted_ids).values() for status, _ in answers}
    assert never_answered == {"pending"}

    async def one_more_question() -> Followed:
        [(client, request_id)] = await _ask(hosts, 1, retry_unavailable=True)
        followed = Followed(request_id)
        await asyncio.wait_for(_follow(client, followed), DEADLINE_S)
        await client.http.aclose()
        return followed

    followed = asyncio.run(one_more_question())
    fold = followed.answer
    assert followed.terminal == "done" and (fold.resets, fold.repeated, fold.skipped) == (0, 0, 0)
    assert _stored(hosts, [followed.request_id])[followed.request_id] == [("done", fold.text)]
    ran = r"Task admin_console\.tasks\.canary_evaluate\[\S+\] succeeded"
    while not any(when > promoted_at for when, _ in _celery_logged(hosts, ran)):
        assert time.monotonic() < deadline, "no periodic task ran on the new primary"
        time.sleep(0.2)
    measured.append(
        f"Redis primary killed: replica promoted after {promoted_s:.2f} s; all {len(request_ids)} "
        f"requests accepted with WAIT answered {answered_s:.2f} s after the kill; "
        f"{len(accepted_ids)} of 3 accepted without WAIT lost, 3 of 3 with WAIT refused (503)"
    )


async def _post(base_url: str, count: int) -> list[tuple[int, str | None]]:
    """`count` questions posted to one web host at once: (status, request id if accepted)."""

    async def one(n: int) -> tuple[int, str | None]:
        async with ChatClient(base_url, timeout_s=30) as client:
            response = await client.post_message(await client.open_page(), f"Is order {n} on its way?")
            return response.status_code, response.json().get("request_id")

    return list(await asyncio.gather(*(one(n) for n in range(count))))


async def _submission_ms(*, with_wait: str, without_wait: str, rounds: int = 40) -> tuple[float, float]:
    """The p50 time of a question's POST to a web host with REDIS_WAIT_REPLICAS=1 and to one
    without, in turns; each question is withdrawn at once so that no worker spends time on it."""
    samples: dict[str, list[float]] = {with_wait: [], without_wait: []}
    clients = {base_url: ChatClient(base_url, timeout_s=30) for base_url in samples}
    for n in range(rounds + 1):
        for base_url, client in clients.items():
            conversation = await client.new_conversation()  # one answer at a time in each
            started = time.perf_counter()
            response = await client.post_message(conversation, f"Where is parcel {n}?")
            elapsed_ms = (time.perf_counter() - started) * 1000
            assert response.status_code == 202, response.text
            await client.cancel(response.json()["request_id"])
            if n:  # the first round warms up connections and caches
                samples[base_url].append(elapsed_ms)
    for client in clients.values():
        await client.http.aclose()
    return statistics.median(samples[with_wait]), statistics.median(samples[without_wait])


def _in_redis(client: redis.Redis, request_id: str) -> bool:
    """Whether this Redis has the request: its result stream or its job in a queue."""
    if any(client.scan_iter(match=f"*{request_id}*")):
        return True
    return any(
        fields.get("request_id") == request_id
        for queue in client.scan_iter(match="llm:{*}:queue:*")
        for _, fields in client.xrange(queue)
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
