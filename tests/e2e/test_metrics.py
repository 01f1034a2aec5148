"""/metrics of a running stack: the web's fleet view and the worker's own endpoint, after traffic."""

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from launcher.process import free_port
from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack
from tests.generation_jobs import MODEL

pytestmark = pytest.mark.e2e

TOKEN = "e2e-metrics-token"
ANSWERS = 6
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.fixture(scope="module")
def stack():
    yield from running_stack(METRICS_TOKEN=TOKEN, WORKER_METRICS_PORT=str(free_port()))


def _worker_url(stack) -> str:
    return f"http://127.0.0.1:{stack.settings_env['WORKER_METRICS_PORT']}/metrics"


@pytest.fixture(scope="module")
def scrapes(stack) -> tuple[dict, dict]:
    """(web, worker) samples after ANSWERS answers: {(name, labels): value}."""

    async def traffic() -> None:
        async with ChatClient(stack.base_url) as guest:
            conversations = [await guest.new_conversation() for _ in range(ANSWERS)]
            request_ids = [
                await guest.ask(c, f"Question {n} about my order") for n, c in enumerate(conversations)
            ]
            results = await asyncio.gather(*(guest.stream(request_id) for request_id in request_ids))
        assert [result.terminal.event for result in results] == ["done"] * ANSWERS

    asyncio.run(traffic())
    return _scrape(f"{stack.base_url}/metrics"), _scrape(_worker_url(stack))


def _scrape(url: str) -> dict:
    response = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert response.status_code == 200, response.text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def _total(samples: dict, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and wanted <= sample_labels
    )


def test_both_endpoints_refuse_a_scraper_without_the_token(stack):
    for url in (f"{stack.base_url}/metrics", _worker_url(stack)):
        refused = httpx.get(url, timeout=10)
        assert refused.status_code == 401
        assert "llm_" not in refused.text
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401


def test_the_web_counts_admissions_and_shows_the_live_worker(scrapes):
    web, _ = scrapes
    assert _total(web, "llm_admissions_total", outcome="admitted", tier="normal") >= ANSWERS
    assert _total(web, "llm_scheduler_redis_up") == 1
    assert _total(web, "llm_workers_live", model=MODEL) == 1
    assert _total(web, "llm_worker_sequence_slots", model=MODEL, engine="simulated") == 8
    assert _total(web, "llm_worker_memory_used_bytes", source="process-rss") > 0
    assert _total(web, "llm_queue_depth", model=MODEL) == 0  # every answer is done
    assert _total(web, "llm_canary_split_percent") == 0
    assert _total(web, "llm_stream_clients") == 0  # every stream has ended


def test_the_worker_measured_every_answer(scrapes):
    _, worker = scrapes
    labels = {"variant": "stable", "tier": "normal"}
    assert _total(worker, "llm_generations_total", **labels, outcome="done") == ANSWERS
    for histogram in (
        "llm_queue_wait_seconds",
        "llm_time_to_first_token_seconds",
        "llm_inter_token_latency_seconds",
        "llm_end_to_end_latency_seconds",
        "llm_output_tokens",
    ):
        assert _total(worker, f"{histogram}_count", **labels) == ANSWERS, histogram
    # The simulated engine answers with SIMULATED_OUTPUT_TOKENS (30) tokens.
    assert _total(worker, "llm_output_tokens_sum", **labels) == 30 * ANSWERS
    assert _total(worker, "llm_time_to_first_token_seconds_sum", **labels) > 0


def test_everything_the_dashboard_and_the_alerts_query_is_scraped(scrapes):
    web, worker = scrapes
    scraped = {name for name, _ in web} | {name for name, _ in worker}
    dashboard = json.loads((DEPLOY / "grafana" / "dashboard.json").read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    queries += [rule["expr"] for group in alerts["groups"] for rule in group["rules"]]
    queried = {name for query in queries for name in re.findall(r"\bllm_[a-z0-9_]+", query)}
    assert queried - scraped == set()
