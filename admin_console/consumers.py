"""The console's live socket: staff tabs join the live group and receive its snapshots."""

from __future__ import annotations

import json
import time
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib import auth

from admin_console.access import is_console_user
from admin_console.live import broadcaster
from scheduler import keys

# Sent when refusing a socket during its handshake; browsers see the handshake fail (HTTP 403).
CLOSE_NOT_STAFF = 4403
# Who holds the socket is checked again at most this often, when a snapshot is to be sent.
ACCESS_RECHECK_S = 5.0


def _still_console_user(session_key: str | None) -> bool:
    """Whether the socket's session still signs in a console user: signed out (the session
    deleted), demoted, deactivated or with another password since, it does not."""
    if not session_key:
        return False
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return is_console_user(auth.get_user(SimpleNamespace(session=session)))


class LiveDashboardConsumer(AsyncWebsocketConsumer):
    joined = False
    checked_at = 0.0

    async def connect(self) -> None:
        if not await database_sync_to_async(is_console_user)(self.scope["user"]):
            await self.close(code=CLOSE_NOT_STAFF)
            return
        await self.channel_layer.group_add(keys.CONSOLE_LIVE_GROUP, self.channel_name)
        self.joined = True
        self.checked_at = time.monotonic()
        await self.accept()
        broadcaster.socket_opened()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            broadcaster.socket_closed()
            await self.channel_layer.group_discard(keys.CONSOLE_LIVE_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The socket only listens; whatever a tab sends is ignored."""

    async def live_snapshot(self, event: dict[str, Any]) -> None:
        if time.monotonic() - self.checked_at >= ACCESS_RECHECK_S:
            session_key = getattr(self.scope.get("session"), "session_key", None)
            if not await database_sync_to_async(_still_console_user)(session_key):
                await self.close(code=CLOSE_NOT_STAFF)
                return
            self.checked_at = time.monotonic()
        # Data only: the page sets it as text (console.js), so nothing from the channel layer is
        # ever parsed as HTML in a staff page.
        await self.send(text_data=json.dumps(event["snapshot"]))
