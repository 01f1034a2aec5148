"""The console's live socket through the whole ASGI stack: origin check, session auth, staff only,
and the snapshot every open tab receives."""

import asyncio

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from accounts.models import User
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


def test_every_staff_tab_receives_the_snapshot_with_a_new_refusal_and_worker():
    staff = User.objects.create_user("sam", password="pw", is_staff=True)
    headers = [ORIGIN, *_session_cookie(staff)]

    async def two_tabs() -> list[str]:
        tabs = []
        for _ in range(2):
            communicator, connected, _ = await _open(headers)
            assert connected
            tabs.append(communicator)
        # Happens while the tabs are open: each must see it without asking.
        await asyncio.to_thread(timeseries.refusal_record, reason="rate_limited")
        worker_id = await asyncio.to_thread(heartbeat, "stable")
        seen = []
        for tab in tabs:
            async with asyncio.timeout(DEADLINE_S):
                while True:
                    html = await tab.receive_from(timeout=DEADLINE_S)
                    if worker_id in html and "rate_limited" in html:
                        seen.append(html)
                        break
            await tab.disconnect()
        return seen

    snapshots = asyncio.run(two_tabs())
    assert len(snapshots) == 2
    assert 'id="live-summary"' in snapshots[0] and 'id="live-tables"' in snapshots[0]
