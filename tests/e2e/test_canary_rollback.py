"""A candidate that fails 30% of its answers is rolled back by the Celery beat evaluation,
whether the answers were asked through the chat or through the API.

Real processes: redis, daphne, a worker for stable's model and one for the candidate's, on a
model of its own (its simulated engine fails 30% of its requests), and Celery with beat
evaluating every 2 s.
"""

import asyncio
import math
import time
from datetime import datetime, timedelta

import httpx
import pytest
import redis

from scheduler import keys
from scheduler.routing import CACHE_S
from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

EVALUATION_S = 2.0
SPLIT_PERCENT = 50
MIN_ANSWERS = 10
MAX_ERROR_RATE_INCREASE_POINTS = 5
GUESTS = 4
AFTER_ROLLBACK_PER_GUEST = 4
CANDIDATE_ON_ITS_OWN_MODEL = (
    "from scheduler.models import Variant; "
    "Variant.objects.filter(name='candidate').update(model='candidate-model')"
)


@pytest.fixture(scope="module")
def stack():
    for stack in running_stack(CANARY_EVALUATION_S=str(EVALUATION_S)):
        # The candidate on a model of its own, whose one worker fails some answers.
        assert stack.manage("shell", "-c", CANDIDATE_ON_ITS_OWN_MODEL).returncode == 0
        stack.start_worker(INFERENCE_MODEL_NAME="candidate-model", SIMULATED_FAILURE_RATE="0.3")
        stack.start_celery()
        yield stack


def _rollout(stack) -> dict | None:
    rows = stack.db_rows("SELECT * FROM admin_console_canaryrollout ORDER BY id DESC LIMIT 1")
    return rows[0] if rows else None


def _answers(stack) -> list[dict]:
    return stack.db_rows(
        "SELECT origin, variant, status, error_code, created_at, finished_at AS completed_at"
        " FROM scheduler_generation ORDER BY finished_at"
    )


_time = Stack.db_time


def _first_breach(answers: list[dict]) -> datetime:
    """When the stored answers first showed the error-rate rule broken, as the evaluation
    counts them (done and failed answers; both variants with enough of them)."""
    counts = {"stable": [0, 0], "candidate": [0, 0]}  # answers, errors
    for answer in answers:
        if answer["status"] not in {"done", "error"}:
            continue
        tally = counts[answer["variant"]]
        tally[0] += 1
        tally[1] += answer["status"] == "error"
        (stable_n, stable_e), (cand_n, cand_e) = counts["stable"], counts["candidate"]
        if min(stable_n, cand_n) >= MIN_ANSWERS and (
            (cand_e / cand_n - stable_e / stable_n) * 100 > MAX_ERROR_RATE_INCREASE_POINTS
        ):
            return _time(answer["completed_at"])
    raise AssertionError(f"the answers never broke the rule: {counts}")


async def _start_canary(stack) -> None:
    """Start a canary of `candidate`; the last one must have ended."""
    async with ChatClient(stack.base_url) as staff:
        await staff.login("sam", stack.staff_password)
        await staff.http.get("/console/canary")
        response = await staff.http.post(
            "/console/canary/start",
            data={
                "csrfmiddlewaretoken": staff.csrf,
                "candidate_variant": "candidate",
                "step_percents": f"{SPLIT_PERCENT}, 100",
                "hold_seconds": "3600",
                "max_error_rate_increase_points": MAX_ERROR_RATE_INCREASE_POINTS,
                # Both variants run the same simulated engine: only the error rate may differ.
                "max_ttft_p95_ratio": 100,
                "max_thumbs_down_increase_points": 10,
                "min_answers": MIN_ANSWERS,
                "min_votes": 5,
                "window_s": 300,
            },
        )
        assert response.status_code == 302, response.text


async def _drive_traffic(stack, deadline_s: float = 120.0) -> None:
    """Guests ask one question per new conversation until the canary is rolled back, then a
    few more each."""
    rolled_back = asyncio.Event()

    async def watch() -> None:
        while not rolled_back.is_set():
            rollout = await asyncio.to_thread(_rollout, stack)
            if rollout["status"] == "rolled_back":
                rolled_back.set()
            await asyncio.sleep(0.2)

    async def guest(n: int) -> None:
        async with ChatClient(stack.base_url) as client:
            started, after = time.monotonic(), 0
            while after < AFTER_ROLLBACK_PER_GUEST and time.monotonic() - started < deadline_s:
                if rolled_back.is_set():
                    after += 1
                conversation = await client.new_conversation()
                request_id = await client.ask(conversation, f"Guest {n}: where is my order?")
                result = await client.stream(request_id)
                assert result.terminal is not None

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(guest(n) for n in range(GUESTS)))
    finally:
        rolled_back.set()
        await watcher


def test_a_failing_candidate_is_rolled_back_within_two_evaluations_having_served_its_share(stack):
    asyncio.run(_start_canary(stack))
    asyncio.run(_drive_traffic(stack))

    rollout = _rollout(stack)
    assert (rollout["status"], rollout["automatic"], rollout["rollback_reason"]) == (
        "rolled_back",
        1,
        "error_rate",
    )
    answers = _answers(stack)
    rolled_back_at = _time(rollout["ended_at"])

    # Within two evaluation periods of the answers first breaking the rule.
    assert rolled_back_at - _first_breach(answers) <= timedelta(seconds=2 * EVALUATION_S)

    # The rollback kept the numbers that triggered it.
    numbers = stack.db_json(rollout["rollback_numbers"])
    assert numbers["split_percent"] == SPLIT_PERCENT
    candidate, stable = numbers["candidate"], numbers["stable"]
    assert min(candidate["answers"], stable["answers"]) >= MIN_ANSWERS
    assert stable["errors"] == 0
    assert (candidate["error_rate"] - stable["error_rate"]) * 100 > MAX_ERROR_RATE_INCREASE_POINTS
    assert {c["rule"]: c["state"] for c in numbers["checks"]}["error_rate"] == "breached"

    # No more than its split's share while it ran (within the sampling noise of a fair split),
    # and nothing new once the rollback reached routing. The share is read from the first
    # answers asked, before the rollback could come: it waits for both variants to have
    # MIN_ANSWERS, so when it came depends on how the split fell, and the answers asked up to
    # then are not a sample of fixed size (one run saw 32 of 44 go to the candidate).
    during = sorted(
        (a for a in answers if _time(a["created_at"]) < rolled_back_at), key=lambda a: _time(a["created_at"])
    )
    first = during[: 2 * MIN_ANSWERS]
    share = sum(a["variant"] == "candidate" for a in first) / len(first)
    assert share <= SPLIT_PERCENT / 100 + 3 * math.sqrt(0.25 / len(first))
    after = [a for a in answers if _time(a["created_at"]) > rolled_back_at + timedelta(seconds=CACHE_S)]
    assert len(after) >= GUESTS
    assert {a["variant"] for a in after} == {"stable"}

    # Each failure ended as an engine error, acknowledged rather than retried.
    failed = [a for a in answers if a["status"] == "error"]
    assert failed and {(a["variant"], a["error_code"]) for a in failed} == {("candidate", "engine_error")}
    client = redis.Redis.from_url(stack.redis.url)
    for tier in keys.TIERS:
        assert client.xpending(keys.queue("candidate-model", tier), keys.CONSUMER_GROUP)["pending"] == 0
    assert client.xlen(keys.dead_letter("candidate-model")) == 0


# --- API traffic ----------------------------------------------------------------------------------

API_CLIENTS = 4


async def _drive_api_traffic(stack, keys_: list[str], deadline_s: float = 120.0) -> list[int]:
    """API clients ask one question per call until the canary is rolled back, then a few more
    each; returns the status of every answered call."""
    rolled_back = asyncio.Event()
    statuses: list[int] = []

    async def watch() -> None:
        while not rolled_back.is_set():
            if (await asyncio.to_thread(_rollout, stack))["status"] == "rolled_back":
                rolled_back.set()
            await asyncio.sleep(0.2)

    async def api_client(key: str) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, timeout=60) as http:
            started, after = time.monotonic(), 0
            while after < AFTER_ROLLBACK_PER_GUEST and time.monotonic() - started < deadline_s:
                if rolled_back.is_set():
                    after += 1
                response = await http.post(
                    "/v1/chat/completions",
                    json={"model": "stable", "messages": [{"role": "user", "content": "Where is my order?"}]},
                )
                if response.status_code == 429:  # this key's limits: back off as told
                    await asyncio.sleep(float(response.headers["Retry-After"]))
                    continue
                statuses.append(response.status_code)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(api_client(key) for key in keys_))
    finally:
        rolled_back.set()
        await watcher
    return statuses


def test_a_failing_candidate_serving_only_api_calls_is_rolled_back(stack):
    keys_ = [stack.create_api_key("alice") for _ in range(API_CLIENTS)]
    asyncio.run(_start_canary(stack))
    started_at = _time(_rollout(stack)["started_at"])
    statuses = asyncio.run(_drive_api_traffic(stack, keys_))

    rollout = _rollout(stack)
    assert (rollout["status"], rollout["automatic"], rollout["rollback_reason"]) == (
        "rolled_back",
        1,
        "error_rate",
    )
    # The candidate's numbers are API calls only: nothing else was asked during this canary.
    candidate = stack.db_json(rollout["rollback_numbers"])["candidate"]
    assert candidate["answers"] >= MIN_ANSWERS and candidate["errors"] > 0
    answered = [a for a in _answers(stack) if a["completed_at"] and _time(a["completed_at"]) >= started_at]
    assert {a["origin"] for a in answered} == {"api"}
    assert any(a["variant"] == "candidate" and a["status"] == "error" for a in answered)
    # The callers saw the failures as errors, and answers from stable once it was rolled back.
    assert set(statuses) == {200, 500}
    rolled_back_at = _time(rollout["ended_at"])
    after = [a for a in answered if _time(a["created_at"]) > rolled_back_at + timedelta(seconds=CACHE_S)]
    assert len(after) >= API_CLIENTS
    assert {a["variant"] for a in after} == {"stable"}
