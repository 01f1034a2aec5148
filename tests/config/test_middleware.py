"""The gate in front of the sync views, through the product's ASGI application as daphne runs it."""

import asyncio
import json
import threading

from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.test import override_settings

from admin_console import health
from config.routing import application


def _get(path: str) -> HttpCommunicator:
    return HttpCommunicator(application, "GET", path, headers=[(b"host", b"localhost")])


@override_settings(WEB_SYNC_VIEWS_MAX=1, WEB_SYNC_VIEW_WAIT_S=0.2)
def test_a_request_for_a_sync_view_that_finds_no_turn_gets_503_while_async_views_still_answer(monkeypatch):
    entered, leave = threading.Event(), threading.Event()

    def serving_slowly() -> bool:
        entered.set()
        leave.wait(timeout=30)
        return True

    monkeypatch.setattr(health, "_serving", serving_slowly)
    monkeypatch.setattr(health, "_database_ready", lambda: True)

    async def scenario():
        first = asyncio.create_task(_get("/readyz").get_response(timeout=30))
        assert await asyncio.to_thread(entered.wait, 30), "the first request never reached its view"
        refused = await _get("/readyz").get_response(timeout=30)
        alive = await _get("/healthz").get_response(timeout=30)
        leave.set()
        return refused, alive, await first

    refused, alive, first = async_to_sync(scenario)()
    assert refused["status"] == 503
    headers = dict(refused["headers"])
    assert int(headers[b"Retry-After"]) >= 1
    assert json.loads(refused["body"])["error"]["message"]
    assert alive["status"] == 200  # liveness is an async view: it never waits for a turn
    assert first["status"] == 200


@override_settings(WEB_SYNC_VIEWS_MAX=1, WEB_SYNC_VIEW_WAIT_S=30)
def test_a_turn_is_handed_on_when_the_request_before_ends(monkeypatch):
    monkeypatch.setattr(health, "_serving", lambda: True)
    monkeypatch.setattr(health, "_database_ready", lambda: True)

    async def scenario():
        return await asyncio.gather(*(_get("/readyz").get_response(timeout=60) for _ in range(5)))

    assert [response["status"] for response in async_to_sync(scenario)()] == [200] * 5
