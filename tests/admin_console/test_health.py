"""The public probes: ready or not, and nothing an outsider could learn the fleet from."""

import pytest
from django.test import Client

from tests.admin_console.conftest import heartbeat

pytestmark = pytest.mark.django_db


def test_readyz_without_a_live_worker_says_not_ready_and_nothing_more():
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "not ready"}


def test_readyz_with_a_live_worker_says_ready_and_nothing_more():
    heartbeat("stable")
    heartbeat("stable")
    response = Client().get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready"}


def test_readyz_with_redis_failing_says_not_ready_without_naming_the_error(monkeypatch):
    heartbeat("stable")

    def refused(*args, **kwargs):
        raise ConnectionRefusedError("connection refused by 10.0.0.7:6379")

    monkeypatch.setattr("admin_console.health.live_workers", refused)
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "not ready"}
    assert b"Connection" not in response.content and b"6379" not in response.content
