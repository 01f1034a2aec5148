"""The live dashboard's snapshots, pushed to every open console tab over the channel layer.

A snapshot is data (JSON: numbers and text already formatted), which the page puts in place as
text (static/admin_console/console.js), never markup: what passes through Redis cannot write into
a staff page. Each period one snapshot is computed and rendered for all tabs: every web process with a tab
open asks for the period's turn (a Redis key set if absent, expiring with the period), and only
the process that gets it computes and sends to the group. N web processes and M tabs cost one
computation and one group send per period; with no tab open nothing is computed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.urls import reverse

from admin_console.selectors import dashboard as dashboard_selectors
from admin_console.templatetags.console_format import NO_DATA, gibibytes, milliseconds, seconds, share
from scheduler import keys
from scheduler.redis import sync_redis

logger = logging.getLogger(__name__)

SNAPSHOT_EVENT = "live.snapshot"  # handled by LiveDashboardConsumer.live_snapshot


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def live_snapshot() -> dict[str, Any]:
    """The dashboard's live region as the htmx fallback poll shows it (admin_console/_live.html),
    as data: `fields` fill the elements with that `data-field`, the rest are table rows."""
    dashboard = dashboard_selectors.dashboard()
    refusals = dashboard.refusals_per_min
    return {
        "fields": {
            "queued_total": str(dashboard.queued_total),
            "queued_note": f"longest predicted wait {seconds(dashboard.longest_wait_s)}"
            if dashboard.queued_total
            else "nothing waiting",
            "running_total": str(dashboard.running_total),
            "slots_total": str(dashboard.slots_total),
            "running_note": f"sequences on {_plural(len(dashboard.workers), 'live worker')}",
            "tokens_per_s": str(dashboard.tokens_per_s),
            "answers_note": f"{_plural(dashboard.answers, 'answer')} finished",
            "ttft_p50": milliseconds(dashboard.ttft_p50_ms),
            "ttft_p95_note": f"p95 {milliseconds(dashboard.ttft_p95_ms)}",
            "itl_p50": milliseconds(dashboard.itl_p50_ms),
            "itl_p95_note": f"p95 {milliseconds(dashboard.itl_p95_ms)}",
            "refusals_total": str(dashboard.refusals_per_min_total),
            "refusals_note": " · ".join(f"{reason} {rate}" for reason, rate in refusals[:2])
            or "none refused",
            "warm_spares": f"{_plural(dashboard.warm_spares, 'warm spare')} per model",
        },
        "queued_total": dashboard.queued_total,
        "refusing": bool(dashboard.refusals_per_min_total),
        "queues": [
            {
                "model": row.model,
                "tier": row.tier,
                "queued": row.queued,
                "predicted_wait": seconds(row.predicted_wait_s) if row.queued else NO_DATA,
                "drain_rate": f"{row.drain_rate_per_s:.1f} jobs/s",
            }
            for row in dashboard.queues
        ],
        "refusals": [{"reason": reason, "per_min": str(rate)} for reason, rate in refusals],
        "fleet": [{"model": row.model, "live": row.live, "desired": row.desired} for row in dashboard.fleet],
        "warm_spares": dashboard.warm_spares,
        "workers": [
            {
                "worker_id": worker.worker_id,
                "model": worker.model,
                "engine": worker.engine,
                "simulated": worker.simulated,
                "running": f"{worker.running} / {worker.slots}",
                "paused": worker.paused,
                "vip_waiting": worker.vip_waiting,
                "kv_cache": share(worker.kv_cache_usage),
                "memory": f"{gibibytes(worker.memory_used_bytes)} of {gibibytes(worker.memory_total_bytes)}",
                "on_gpu": worker.on_gpu,
                "heartbeat_age": f"{seconds(worker.heartbeat_age_s)} ago",
                "draining": worker.draining,
                "spare": worker.spare,
                "drain_url": reverse("console:worker_drain", args=[worker.worker_id]),
            }
            for worker in dashboard.workers
        ],
        "charts": dashboard.charts,
    }


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

    def _snapshot_if_our_turn(self, period_s: float) -> dict[str, Any] | None:
        # The turn lapses a little before the next period starts, so the process that has it
        # normally keeps it, and another one takes over when it stops asking.
        won = sync_redis().set(
            keys.CONSOLE_LIVE_TURN, self.process_token, nx=True, px=max(1, int(period_s * 900))
        )
        return live_snapshot() if won else None

    async def _run(self) -> None:
        layer = get_channel_layer()
        loop = asyncio.get_running_loop()
        while self.sockets:
            period_s = settings.CONSOLE_LIVE_PERIOD_S
            started = loop.time()
            try:
                snapshot = await sync_to_async(self._snapshot_if_our_turn)(period_s)
                if snapshot is not None:
                    await layer.group_send(
                        keys.CONSOLE_LIVE_GROUP, {"type": SNAPSHOT_EVENT, "snapshot": snapshot}
                    )
            except Exception:  # a Redis or database outage: the tabs keep their last numbers
                logger.exception("live dashboard snapshot failed; trying again next period")
            await asyncio.sleep(max(0.0, period_s - (loop.time() - started)))


broadcaster = LiveBroadcaster()
