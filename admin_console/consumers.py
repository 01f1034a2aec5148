"""The console's live socket: staff tabs join the live group and receive its snapshots."""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from admin_console.access import is_console_user
from admin_console.live import broadcaster
from scheduler import keys

# Sent when refusing a socket during its handshake; browsers see the handshake fail (HTTP 403).
CLOSE_NOT_STAFF = 4403


class LiveDashboardConsumer(AsyncWebsocketConsumer):
    joined = False

    async def connect(self) -> None:
        if not await database_sync_to_async(is_console_user)(self.scope["user"]):
            await self.close(code=CLOSE_NOT_STAFF)
            return
        await self.channel_layer.group_add(keys.CONSOLE_LIVE_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        broadcaster.socket_opened()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            broadcaster.socket_closed()
            await self.channel_layer.group_discard(keys.CONSOLE_LIVE_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The socket only listens; whatever a tab sends is ignored."""

    async def live_snapshot(self, event: dict[str, Any]) -> None:
        # Data only: the page sets it as text (console.js), so nothing from the channel layer is
        # ever parsed as HTML in a staff page.
        await self.send(text_data=json.dumps(event["snapshot"]))
