"""The inbox's live socket, `/console/inbox/socket`: an agent's tab gets its inbox as data (JSON,
rendered by the page with DOM calls; never HTML) whenever something in it changes, and the
events of the conversation it has open; it beats, which is the agent's presence.

What changed comes from the inbox's Redis stream (chat.handoff_events, written once a change
commits), followed by the web process's one follower, as chat pages follow their streams; each
tab then reads its agent's snapshot from the database, the record. A tab also reads it every
INBOX_REFRESH_S, so a lost event costs seconds, never a stale inbox.

Messages from the tab: `{"type": "beat"}` (presence; the agent permission is checked again),
`{"type": "watch", "conversation": id, "after": event id}` (follow that conversation's
events), `{"type": "typing", "conversation": id}` (the customer sees the agent typing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from accounts.models import User
from admin_console.access import is_agent
from chat import handoff, handoff_events
from chat.handoff_selectors import inbox_snapshot
from chat.models import Conversation
from chat.presence import presence_beat, presence_leave
from scheduler import keys
from scheduler.results import parse_event_id, result_follower

logger = logging.getLogger(__name__)

CLOSE_NOT_AGENT = 4403
INBOX_REFRESH_S = 10.0
# Changes that come together (a claim and its message) make one snapshot.
COALESCE_S = 0.2


def _beat(user: User, tab_id: str) -> bool:
    """The agent's presence, if they are still an agent (the permission may have been taken
    away, or the account deactivated, since the socket opened)."""
    current = User.objects.filter(pk=user.pk).first()
    if current is None or not is_agent(current):
        return False
    presence_beat(agent_id=user.pk, tab_id=tab_id)
    return True


def _typing(user: User, conversation_id: str) -> None:
    conversation = Conversation.objects.filter(
        pk=conversation_id, assignee=user, handoff_state=Conversation.HandoffState.AGENT
    ).first()
    if conversation is not None:
        handoff.typing_publish(
            conversation=conversation, who="agent", author=handoff.agent_display_name(user)
        )


class InboxConsumer(AsyncJsonWebsocketConsumer):
    # No channel layer: the socket's feed is the inbox's stream. A consumer on the layer also
    # blocks on its own channel, and a read that outlived Redis's socket timeout (nothing sent
    # to it for 5 s) ended the socket.
    channel_layer_alias = "inbox sockets use none"
    tab_id = ""
    user: User

    async def connect(self) -> None:
        self.user = self.scope["user"]
        if not await database_sync_to_async(is_agent)(self.user):
            await self.close(code=CLOSE_NOT_AGENT)
            return
        self.tab_id = uuid.uuid4().hex
        self._refresh = asyncio.Event()
        self._watching: asyncio.Task[None] | None = None
        await self.accept()
        await database_sync_to_async(_beat)(self.user, self.tab_id)
        after = await database_sync_to_async(handoff_events.inbox_last_id)()
        self._tasks = [
            asyncio.create_task(self._follow_inbox(after), name="inbox-follow"),
            asyncio.create_task(self._push_loop(), name="inbox-push"),
        ]

    async def disconnect(self, code: int) -> None:
        if not self.tab_id:
            return
        for task in [*self._tasks, *([self._watching] if self._watching else [])]:
            task.cancel()
        with contextlib.suppress(Exception):
            await database_sync_to_async(presence_leave)(agent_id=self.user.pk, tab_id=self.tab_id)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            return
        kind = content.get("type")
        if kind == "beat":
            if not await database_sync_to_async(_beat)(self.user, self.tab_id):
                await self.close(code=CLOSE_NOT_AGENT)
        elif kind == "watch":
            self._watch(str(content.get("conversation", "")), str(content.get("after", "")))
        elif kind == "typing":
            conversation_id = str(content.get("conversation", ""))
            with contextlib.suppress(ValueError):
                uuid.UUID(conversation_id)
                await database_sync_to_async(_typing)(self.user, conversation_id)

    async def _push_loop(self) -> None:
        """Send the agent's inbox now, again whenever it changes, and every INBOX_REFRESH_S."""
        while True:
            try:
                snapshot = await database_sync_to_async(inbox_snapshot)(agent=self.user)
                await self.send_json({"type": "inbox", **snapshot})
            except Exception:  # a database or Redis outage: the tab keeps its last lists
                logger.exception("the inbox of agent %s could not be read", self.user.pk)
            self._refresh.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(INBOX_REFRESH_S):
                    await self._refresh.wait()
                    await asyncio.sleep(COALESCE_S)

    async def _follow_inbox(self, after: str) -> None:
        async with result_follower().follow(
            key=keys.INBOX_EVENTS, after_id=parse_event_id(after), codec=handoff_events.INBOX_EVENTS
        ) as subscription:
            while True:
                with contextlib.suppress(TimeoutError):
                    batch = await subscription.next_batch(INBOX_REFRESH_S)
                    if batch:
                        self._refresh.set()

    def _watch(self, conversation_id: str, after: str) -> None:
        """Follow one conversation's events (the one the tab shows), instead of the last one."""
        if self._watching is not None:
            self._watching.cancel()
            self._watching = None
        try:
            uuid.UUID(conversation_id)
        except ValueError:
            return
        self._watching = asyncio.create_task(
            self._follow_conversation(conversation_id, parse_event_id(after))
        )

    async def _follow_conversation(self, conversation_id: str, after: str) -> None:
        async with result_follower().follow(
            key=keys.conversation_events(conversation_id),
            after_id=after,
            codec=handoff_events.CONVERSATION_EVENTS,
        ) as subscription:
            while True:
                with contextlib.suppress(TimeoutError):
                    for event in await subscription.next_batch(INBOX_REFRESH_S):
                        await self.send_json(
                            {
                                "type": "event",
                                "conversation": conversation_id,
                                "id": event.id,
                                "event": event.body.type,
                                "data": handoff_events.event_data(event.body),
                                "at_ms": event.at_ms,
                            }
                        )
