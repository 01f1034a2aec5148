"""The live dashboard's snapshots, pushed to every open console tab over the channel layer.

Each period one snapshot is computed and rendered for all tabs: every web process with a tab
open asks for the period's turn (a Redis key set if absent, expiring with the period), and only
the process that gets it computes and sends to the group. N web processes and M tabs cost one
computation and one group send per period; with no tab open nothing is computed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.template.loader import render_to_string

from admin_console import selectors
from scheduler import keys
from scheduler.redis import sync_redis

logger = logging.getLogger(__name__)

SNAPSHOT_EVENT = "live.snapshot"  # handled by LiveDashboardConsumer.live_snapshot


def live_html() -> str:
    """The dashboard's live region, the same HTML as the htmx fallback poll swaps in."""
    return render_to_string("admin_console/_live.html", {"dashboard": selectors.dashboard(), "oob": True})


class LiveBroadcaster:
    """Runs in each web process while it has open live sockets."""

    def __init__(self) -> None:
        self.process_token = uuid.uuid4().hex
        self.sockets = 0
        self.task: asyncio.Task[None] | None = None

    def socket_opened(self) -> None:
        self.sockets += 1
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.task = loop.create_task(self._run(), name="console-live")

    def socket_closed(self) -> None:
        self.sockets = max(0, self.sockets - 1)

    def _snapshot_if_our_turn(self, period_s: float) -> str | None:
        # The turn lapses a little before the next period starts, so the process that has it
        # normally keeps it, and another one takes over when it stops asking.
        won = sync_redis().set(
            keys.CONSOLE_LIVE_TURN, self.process_token, nx=True, px=max(1, int(period_s * 900))
        )
        return live_html() if won else None

    async def _run(self) -> None:
        layer = get_channel_layer()
        loop = asyncio.get_running_loop()
        while self.sockets:
            period_s = settings.CONSOLE_LIVE_PERIOD_S
            started = loop.time()
            try:
                html = await sync_to_async(self._snapshot_if_our_turn)(period_s)
                if html is not None:
                    await layer.group_send(keys.CONSOLE_LIVE_GROUP, {"type": SNAPSHOT_EVENT, "html": html})
            except Exception:  # a Redis or database outage: the tabs keep their last numbers
                logger.exception("live dashboard snapshot failed; trying again next period")
            await asyncio.sleep(max(0.0, period_s - (loop.time() - started)))


broadcaster = LiveBroadcaster()
