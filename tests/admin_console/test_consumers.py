"""The console's live socket through the whole ASGI stack: origin check, session auth, staff only,
and the snapshot every open tab receives."""

import asyncio
import functools
import json

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from accounts.models import User
from admin_console import consumers
from config.routing import application
from scheduler import timeseries
from tests.admin_console.conftest import heartbeat

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("tier_policies")]

PATH = "/console/live/socket"
ORIGIN = (b"origin", b"http://localhost")
# Long enough that no test waits on a broken socket forever; never reached when things work.
DEADLINE_S = 10


def _session_cookie(user: User | None) -> list[tuple[bytes, bytes]]:
    if user is None:
        return []
    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    return [(b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode())]


async def _open(headers: list[tuple[bytes, bytes]]) -> tuple[WebsocketCommunicator, bool, int | str]:
    communicator = WebsocketCommunicator(application, PATH, headers=headers)
    connected, code = await communicator.connect(timeout=DEADLINE_S)
    return communicator, connected, code


def _refused(headers: list[tuple[bytes, bytes]]) -> bool:
    async def attempt() -> bool:
        communicator, connected, _ = await _open(headers)
        await communicator.disconnect()
        return not connected

    return asyncio.run(attempt())


def test_visitors_customers_and_other_sites_get_no_socket():
    customer = User.objects.create_user("alice", password="pw")
    staff = User.objects.create_user("sam", password="pw", is_staff=True)
    assert _refused([ORIGIN])
    assert _refused([ORIGIN, *_session_cookie(customer)])
    assert _refused([(b"origin", b"http://evil.example"), *_session_cookie(staff)])


def _snapshot_with(tab: WebsocketCommunicator, found) -> dict:
    """The first snapshot the tab receives for which `found(snapshot)` holds."""

    async def receive() -> dict:
        async with asyncio.timeout(DEADLINE_S):
            while True:
                snapshot = json.loads(await tab.receive_from(timeout=DEADLINE_S))
                if found(snapshot):
                    return snapshot

    return receive()


def test_every_staff_tab_receives_the_snapshot_with_a_new_refusal_and_worker():
    staff = User.objects.create_user("sam", password="pw", is_staff=True)
    headers = [ORIGIN, *_session_cookie(staff)]

    async def two_tabs() -> list[dict]:
        tabs = []
        for _ in range(2):
            communicator, connected, _ = await _open(headers)
            assert connected
            tabs.append(communicator)
        # Happens while the tabs are open: each must see it without asking.
        await asyncio.to_thread(timeseries.refusal_record, reason="rate_limited")
        worker_id = await asyncio.to_thread(heartbeat, "stable")

        def found(snapshot: dict) -> bool:
            workers = [worker["worker_id"] for worker in snapshot["workers"]]
            reasons = [row["reason"] for row in snapshot["refusals"]]
            return worker_id in workers and "rate_limited" in reasons

        seen = []
        for tab in tabs:
            seen.append(await _snapshot_with(tab, found))
            await tab.disconnect()
        return seen

    snapshots = asyncio.run(two_tabs())
    assert len(snapshots) == 2
    assert snapshots[0]["fields"]["running_total"] == "3"
    assert snapshots[0]["fields"]["refusals_note"].startswith("rate_limited ")


@pytest.mark.security
def test_markup_written_into_redis_reaches_staff_tabs_as_data_not_html():
    """Whoever can write to Redis can name a worker anything: its name travels as a JSON string,
    which the page sets as text, never as HTML parsed into the console."""
    staff = User.objects.create_user("sam", password="pw", is_staff=True)
    planted = '<img src=x onerror="alert(document.cookie)">'
    headers = [ORIGIN, *_session_cookie(staff)]

    async def tab() -> dict:
        communicator, connected, _ = await _open(headers)
        assert connected
        await asyncio.to_thread(functools.partial(heartbeat, "stable", model=planted))
        snapshot = await _snapshot_with(
            communicator, lambda s: any(w["model"] == planted for w in s["workers"])
        )
        await communicator.disconnect()
        return snapshot

    snapshot = asyncio.run(tab())
    [worker] = [w for w in snapshot["workers"] if w["model"] == planted]
    assert worker["model"] == planted  # the same characters, to be shown as they are


def _closed_after(headers: list[tuple[bytes, bytes]], change) -> dict:
    """Open a tab, see a snapshot, make `change` (in a thread), then the tab's next output that
    is not a snapshot."""

    async def tab() -> dict:
        communicator, connected, _ = await _open(headers)
        assert connected
        await communicator.receive_from(timeout=DEADLINE_S)
        await asyncio.to_thread(change)
        async with asyncio.timeout(DEADLINE_S):
            while True:
                output = await communicator.receive_output(timeout=DEADLINE_S)
                if output["type"] == "websocket.close":
                    return output

    return asyncio.run(tab())


@pytest.mark.security
def test_a_staff_member_demoted_while_watching_stops_receiving_the_dashboard(monkeypatch):
    monkeypatch.setattr(consumers, "ACCESS_RECHECK_S", 0.0)
    staff = User.objects.create_user("sam", password="pw", is_staff=True)
    closed = _closed_after(
        [ORIGIN, *_session_cookie(staff)], lambda: User.objects.filter(pk=staff.pk).update(is_staff=False)
    )
    assert closed["code"] == consumers.CLOSE_NOT_STAFF


@pytest.mark.security
def test_signing_out_elsewhere_closes_the_dashboards_socket(monkeypatch):
    monkeypatch.setattr(consumers, "ACCESS_RECHECK_S", 0.0)
    staff = User.objects.create_user("sam", password="pw", is_staff=True)
    browser = Client()
    browser.force_login(staff)
    cookie = browser.cookies[settings.SESSION_COOKIE_NAME].value
    headers = [ORIGIN, (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode())]
    closed = _closed_after(headers, browser.logout)
    assert closed["code"] == consumers.CLOSE_NOT_STAFF
