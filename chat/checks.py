"""System checks for the settings of the chat's streams.

`manage.py check` runs them, and so does every process when it starts (config/startup.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from chat.relay import RECONNECT_MS


@register()
def stream_timing_check(**kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    heartbeat_s, proxy_s = settings.SSE_HEARTBEAT_S, settings.PROXY_STREAM_READ_TIMEOUT_S
    if heartbeat_s <= 0 or (proxy_s > 0 and heartbeat_s >= proxy_s):
        messages.append(
            Error(
                f"SSE_HEARTBEAT_S = {heartbeat_s:g} s: a stream waiting in the queue or on a slow "
                f"answer stays silent longer than the proxy waits (PROXY_STREAM_READ_TIMEOUT_S = "
                f"{proxy_s:g} s), and the proxy cuts it.",
                hint=(
                    "Set SSE_HEARTBEAT_S to a third of the proxy's read timeout for /chat/stream/ "
                    "(default 15 s, against deploy/nginx.conf's 45 s), or raise both."
                ),
                id="chat.E001",
            )
        )
    if settings.SSE_STATUS_INTERVAL_S <= 0:
        messages.append(
            Error(
                f"SSE_STATUS_INTERVAL_S = {settings.SSE_STATUS_INTERVAL_S:g} s: queued streams "
                "would send status events without pause.",
                hint="Set SSE_STATUS_INTERVAL_S to a second or more (default 2).",
                id="chat.E002",
            )
        )
    grace_s = settings.STREAM_DISCONNECT_GRACE_S
    if grace_s < RECONNECT_MS / 1000:
        messages.append(
            Warning(
                f"STREAM_DISCONNECT_GRACE_S = {grace_s:g} s is shorter than a browser takes to "
                f"reconnect ({RECONNECT_MS / 1000:g} s): a page reload or a network blip cancels "
                "the answer being written.",
                hint=f"Set STREAM_DISCONNECT_GRACE_S to {RECONNECT_MS / 1000:g} s or more (default 30).",
                id="chat.W001",
            )
        )
    return messages
