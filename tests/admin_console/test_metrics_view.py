import pytest
from django.test import RequestFactory, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from admin_console.metrics_view import metrics
from admin_console.models import CanaryRollout

pytestmark = pytest.mark.django_db


def _get(remote_addr: str = "127.0.0.1", **headers: str):
    return metrics(RequestFactory().get("/metrics", REMOTE_ADDR=remote_addr, **headers))


def _samples(response) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def test_a_scraper_on_this_host_gets_the_process_and_the_fleet_in_prometheus_text():
    response = _get()
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    names = {name for name, _ in _samples(response)}
    assert {"llm_scheduler_redis_up", "llm_queue_depth", "llm_workers_live", "llm_stream_clients"} <= names
    assert any(name.startswith("process_") for name in names)


def test_a_scraper_from_another_network_is_refused():
    response = _get("203.0.113.7")
    assert response.status_code == 403
    assert b"llm_" not in response.content


def test_a_request_through_an_untrusted_proxy_on_this_host_is_refused():
    assert _get("127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.7").status_code == 403


@override_settings(METRICS_TOKEN="s3cret-token")
def test_with_a_token_set_a_scraper_needs_it_even_on_this_host():
    refused = _get()
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert _get(HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert _get("203.0.113.7", HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200


def test_only_get_is_served():
    response = metrics(RequestFactory().post("/metrics", REMOTE_ADDR="127.0.0.1"))
    assert response.status_code == 405


def test_canary_rollbacks_are_counted_by_trigger_from_the_rollouts():
    def rollout(status: str, *, automatic: bool) -> CanaryRollout:
        return CanaryRollout.objects.create(
            stable_variant="stable",
            candidate_variant="next",
            steps=[{"percent": 100, "hold_s": 0}],
            step_started_at=timezone.now(),
            status=status,
            automatic=automatic,
        )

    rollout(CanaryRollout.Status.ROLLED_BACK, automatic=True)
    rollout(CanaryRollout.Status.ROLLED_BACK, automatic=True)
    rollout(CanaryRollout.Status.ROLLED_BACK, automatic=False)
    rollout(CanaryRollout.Status.PROMOTED, automatic=True)

    samples = _samples(_get())

    assert samples[("llm_canary_rollbacks_total", frozenset({("trigger", "automatic")}))] == 2
    assert samples[("llm_canary_rollbacks_total", frozenset({("trigger", "manual")}))] == 1
