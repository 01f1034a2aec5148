import socket
import urllib.error
import urllib.request
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from inference import metrics
from scheduler.generation import Timings, Usage
from scheduler.services import GenerationOutcome


@pytest.fixture
def variant() -> str:
    """A variant of its own, so each test reads only its own samples of the shared registry."""
    return f"v-{uuid.uuid4().hex[:8]}"


def _sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def _failed(code: str) -> GenerationOutcome:
    return GenerationOutcome(status="error", error_code=code, error_message="...")


def test_a_completed_answer_records_its_latencies_tokens_and_outcome(variant):
    metrics.answer_observe(
        variant=variant,
        tier="vip",
        outcome=GenerationOutcome(
            status="done",
            usage=Usage(prompt_tokens=5, completion_tokens=11),
            timings=Timings(queue_ms=500.0, ttft_ms=100.0, duration_ms=1100.0, engine="simulated"),
        ),
    )
    labels = {"variant": variant, "tier": "vip"}
    assert _sample("llm_generations_total", **labels, outcome="done") == 1
    assert _sample("llm_queue_wait_seconds_sum", **labels) == 0.5
    assert _sample("llm_time_to_first_token_seconds_sum", **labels) == 0.1
    assert _sample("llm_end_to_end_latency_seconds_sum", **labels) == 1.6
    assert _sample("llm_output_tokens_sum", **labels) == 11
    # 10 gaps between 11 tokens in the second after the first one.
    assert _sample("llm_inter_token_latency_seconds_sum", **labels) == pytest.approx(0.1)
    assert _sample("llm_inter_token_latency_seconds_bucket", **labels, le="0.1") == 1
    assert _sample("llm_inter_token_latency_seconds_bucket", **labels, le="0.075") == 0


def test_a_cancelled_answer_counts_its_wait_and_first_token_but_not_its_speed(variant):
    metrics.answer_observe(
        variant=variant,
        tier="normal",
        outcome=GenerationOutcome(
            status="cancelled",
            usage=Usage(prompt_tokens=5, completion_tokens=4),
            timings=Timings(queue_ms=200.0, ttft_ms=50.0, duration_ms=400.0, engine="simulated"),
        ),
    )
    labels = {"variant": variant, "tier": "normal"}
    assert _sample("llm_generations_total", **labels, outcome="cancelled") == 1
    assert _sample("llm_time_to_first_token_seconds_count", **labels) == 1
    assert _sample("llm_queue_wait_seconds_count", **labels) == 1
    assert _sample("llm_end_to_end_latency_seconds_count", **labels) is None
    assert _sample("llm_inter_token_latency_seconds_count", **labels) is None


def test_an_answer_that_never_ran_counts_only_its_outcome(variant):
    metrics.answer_observe(variant=variant, tier="normal", outcome=_failed("expired"))
    assert _sample("llm_generations_total", variant=variant, tier="normal", outcome="expired") == 1
    assert _sample("llm_queue_wait_seconds_count", variant=variant, tier="normal") is None


def test_a_workers_series_exist_at_zero_before_its_first_answer(variant):
    metrics.series_init(f"model-of-{variant}")
    assert _sample("llm_jobs_dead_lettered_total", model=f"model-of-{variant}") == 0
    metrics.variant_series_init(variant)  # when it starts a first job of the variant
    assert _sample("llm_generations_total", variant=variant, tier="vip", outcome="timeout") == 0
    assert _sample("llm_time_to_first_token_seconds_count", variant=variant, tier="batch") == 0


# --- the worker's endpoint ----------------------------------------------------------------------


@pytest.fixture
def exporter():
    server = metrics.exporter_start(addr="127.0.0.1", port=0)
    yield f"http://127.0.0.1:{server.server_port}/metrics"
    server.shutdown()
    server.server_close()


def _fetch(url: str, token: str | None = None) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read().decode()


def test_the_exporter_serves_the_workers_metrics_to_this_host(exporter, variant):
    metrics.answer_observe(variant=variant, tier="vip", outcome=_failed("timeout"))
    status, _, body = _fetch(exporter)
    assert status == 200
    samples = [sample for family in text_string_to_metric_families(body) for sample in family.samples]
    assert any(
        sample.name == "llm_generations_total"
        and sample.labels == {"variant": variant, "tier": "vip", "outcome": "timeout"}
        and sample.value == 1
        for sample in samples
    )


def test_the_exporter_applies_the_same_rule_as_the_web(exporter):
    with override_settings(METRICS_ALLOWED_NETWORKS=["10.0.0.0/8"]):
        assert _fetch(exporter)[0] == 403
    with override_settings(METRICS_TOKEN="s3cret-token"):
        status, headers, body = _fetch(exporter)
        assert (status, headers["WWW-Authenticate"]) == (401, 'Bearer realm="metrics"')
        assert "llm_" not in body
        assert _fetch(exporter, token="s3cret-token")[0] == 200


def test_a_taken_port_stops_the_worker_with_a_clear_message():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ImproperlyConfigured, match="WORKER_METRICS_PORT"):
            metrics.exporter_start(addr="127.0.0.1", port=taken.getsockname()[1])


@override_settings(WORKER_METRICS_PORT=0)
def test_the_exporter_is_off_by_default():
    assert metrics.worker_exporter_start() is None
