"""The hand-off's live events: what a conversation's event stream holds, their one encoder and
decoder, and the write after a change commits.

The database is the record (chat.handoff writes it first); the stream is the delivery, to the
customer's page (SSE, chat.relay) and to the agent's inbox (admin_console's socket). Its entry
ids are the SSE event ids, so a page resumes from `Last-Event-ID` without loss or repeat; and
every message event names its stored message, so a page that also read the database shows
each message once. Private notes are never written here.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, ClassVar

import redis
from django.conf import settings

from scheduler import keys
from scheduler.redis import sync_redis

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Requested:
    """A person was asked for; the relay sends the customer `waiting` with the position."""

    type: ClassVar[str] = "requested"
    trigger: str
    agents_online: int


@dataclass(frozen=True, slots=True)
class AgentJoined:
    type: ClassVar[str] = "agent_joined"
    agent: str  # the agent's display name


@dataclass(frozen=True, slots=True)
class MessageSent:
    """A message stored in the conversation: the customer's (for the agent, and the customer's
    other pages) or an agent's."""

    type: ClassVar[str] = "message"
    id: int  # the stored message's id
    role: str  # "user" | "agent"
    text: str
    author: str | None  # an agent's display name
    at: str  # ISO 8601


@dataclass(frozen=True, slots=True)
class Typing:
    """Someone is typing (not stored: readers drop one older than TYPING_FRESH_S)."""

    type: ClassVar[str] = "typing"
    who: str  # "customer" | "agent"
    author: str | None


@dataclass(frozen=True, slots=True)
class HandedBack:
    """Back with the assistant: an agent handed it back, or the customer stopped waiting."""

    type: ClassVar[str] = "handed_back"
    by: str  # "agent" | "customer"


@dataclass(frozen=True, slots=True)
class Resolved:
    type: ClassVar[str] = "resolved"
    agent: str


@dataclass(frozen=True, slots=True)
class RatingRequest:
    type: ClassVar[str] = "rating_request"
    handoff: int


@dataclass(frozen=True, slots=True)
class Failed:
    """The relay lost the stream: the page reloads what it shows from the database."""

    type: ClassVar[str] = "error"
    code: str
    message: str


ConversationEventBody = (
    Requested | AgentJoined | MessageSent | Typing | HandedBack | Resolved | RatingRequest | Failed
)
_TYPES: dict[str, type[Any]] = {
    kind.type: kind
    for kind in (Requested, AgentJoined, MessageSent, Typing, HandedBack, Resolved, RatingRequest, Failed)
}
# A typing event older than this is not shown (it is replayed with the rest after a reconnect).
TYPING_FRESH_S = 6.0


def event_data(body: ConversationEventBody) -> dict[str, Any]:
    """An event's fields as the pages read them (SSE `data`, the inbox socket's `data`)."""
    return asdict(body)


def event_encode(body: ConversationEventBody) -> tuple[str, str]:
    return body.type, json.dumps(event_data(body), separators=(",", ":"))


def event_decode(kind: str, data: dict[str, Any]) -> ConversationEventBody:
    """Raises ValueError for an unknown type, TypeError or KeyError for a malformed one."""
    cls = _TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown conversation event type {kind!r}")
    return cls(**data)


@dataclass(frozen=True, slots=True)
class ConversationEvent:
    """One entry of a conversation's event stream."""

    id: str
    body: ConversationEventBody

    @property
    def at_ms(self) -> int:
        """When Redis stored it (its id's first part)."""
        return int(self.id.partition("-")[0])


class ConversationEventCodec:
    """How scheduler.results' follower reads a conversation's (or the inbox's) stream."""

    def parse(self, entry_id: str, fields: list[str]) -> ConversationEvent:
        entry = dict(zip(fields[::2], fields[1::2], strict=True))
        return ConversationEvent(entry_id, event_decode(entry["type"], json.loads(entry["data"])))

    def failure(self, entry_id: str, code: str, message: str) -> ConversationEvent:
        return ConversationEvent(entry_id, Failed(code=code, message=message))


CONVERSATION_EVENTS = ConversationEventCodec()


# --- the inbox's stream: "look again", with the conversation it concerns -------------------------


class InboxEventCodec:
    def parse(self, entry_id: str, fields: list[str]) -> InboxEntry:
        entry = dict(zip(fields[::2], fields[1::2], strict=True))
        return InboxEntry(entry_id, entry.get("conversation", ""))

    def failure(self, entry_id: str, code: str, message: str) -> InboxEntry:
        return InboxEntry(entry_id, "", failed=True)


@dataclass(frozen=True, slots=True)
class InboxEntry:
    id: str
    conversation: str
    failed: bool = False


INBOX_EVENTS = InboxEventCodec()


def iso(moment: datetime) -> str:
    return moment.isoformat()


def events_publish(conversation_id: str, bodies: list[ConversationEventBody], *, inbox: bool) -> None:
    """Append events to the conversation's stream (and, with `inbox`, tell every open inbox to
    look again), in one round trip. Called once the change they tell of is committed: a reader
    that sees an event finds its row. A Redis that cannot take them loses only the delivery:
    pages read the database again when their stream reconnects, inboxes every few seconds."""
    stream = keys.conversation_events(conversation_id)
    try:
        with sync_redis().pipeline(transaction=False) as pipe:
            for body in bodies:
                kind, data = event_encode(body)
                pipe.xadd(
                    stream, {"type": kind, "data": data}, maxlen=settings.HANDOFF_EVENTS_MAX, approximate=True
                )
            pipe.expire(stream, settings.HANDOFF_EVENTS_TTL_S)
            if inbox:
                pipe.xadd(keys.INBOX_EVENTS, {"conversation": conversation_id}, maxlen=1000, approximate=True)
            pipe.execute()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        logger.warning(
            "hand-off events of %s not delivered (%s): pages read them on reconnect", conversation_id, exc
        )


def stream_last_id(conversation_id: str) -> str:
    """The id of the stream's last entry ("0-0" when it has none): a page rendered from the
    database after this read follows the stream from here."""
    try:
        last = sync_redis().xrevrange(keys.conversation_events(conversation_id), count=1)
    except (redis.ConnectionError, redis.TimeoutError):
        return "0-0"
    return last[0][0] if last else "0-0"


def inbox_last_id() -> str:
    """The inbox stream's last id; "0-0" while Redis cannot say (a replay only makes the inbox
    look again)."""
    try:
        last = sync_redis().xrevrange(keys.INBOX_EVENTS, count=1)
    except (redis.ConnectionError, redis.TimeoutError):
        return "0-0"
    return last[0][0] if last else "0-0"
