"""The answer stream through the product's ASGI application: who may read a request's answer,
how a finished one replays, and that a client who leaves stops counting as a watcher."""

import asyncio
import json

import pytest
from channels.testing import ApplicationCommunicator, HttpCommunicator
from django.test import Client

from accounts.models import User
from chat import guests
from chat.consumers import stream_url
from chat.models import Conversation, Message
from config.routing import application
from scheduler import keys
from scheduler.generation import Done, Start, Token
from scheduler.redis import new_async_redis, sync_redis
from scheduler.results import ResultPublisher
from tests.generation_jobs import MODEL, generation_record

pytestmark = pytest.mark.django_db(transaction=True)

# Long enough that no test waits on a broken stream forever; never reached when things work.
DEADLINE_S = 10


def _answer(*, owner: User | None = None, guest_key: str = "") -> Message:
    conversation = Conversation.objects.create(owner=owner, session_key=guest_key)
    return Message.objects.create(
        conversation=conversation, role=Message.Role.ASSISTANT, generation=generation_record(status="pending")
    )


def _publish_answer(message: Message, *texts: str) -> None:
    async def publish():
        client = new_async_redis()
        publisher = ResultPublisher(client)
        publishing = asyncio.create_task(publisher.run())
        try:
            request_id = str(message.generation_id)
            publisher.emit(MODEL, request_id, Start(worker="w", variant="stable", attempt=1))
            for seq, text in enumerate(texts):  # an engine step each, written before the next
                await publisher.emit(MODEL, request_id, Token(seq=seq, text=text))
            await publisher.emit(MODEL, request_id, Done(finish_reason="stop"))
        finally:
            publishing.cancel()
            await client.aclose()

    asyncio.run(publish())


def _cookies(client: Client) -> list[tuple[bytes, bytes]]:
    cookie = "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())
    return [(b"cookie", cookie.encode())]


def _signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _get(message: Message, headers: list[tuple[bytes, bytes]], method: str = "GET") -> dict:
    communicator = HttpCommunicator(application, method, stream_url(message.generation_id), headers=headers)
    return asyncio.run(communicator.get_response(timeout=DEADLINE_S))


def _events(body: bytes) -> list[tuple[str, dict]]:
    events = []
    for block in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


@pytest.mark.security
def test_the_owner_reads_the_answer_as_events_and_others_get_not_found():
    alice = User.objects.create_user("alice", password="pw")
    bob = User.objects.create_user("bob", password="pw")
    answer = _answer(owner=alice)
    _publish_answer(answer, "Your order ", "ships today.")

    response = _get(answer, _cookies(_signed_in(alice)))
    assert response["status"] == 200
    headers = dict(response["headers"])
    assert headers[b"content-type"] == b"text/event-stream"
    assert headers[b"cache-control"] == b"no-cache"
    events = _events(response["body"])
    assert [kind for kind, _ in events] == ["status", "token", "token", "done"]
    assert "".join(data["text"] for kind, data in events if kind == "token") == "Your order ships today."

    for stranger in ([], _cookies(_signed_in(bob))):
        refused = _get(answer, stranger)
        assert refused["status"] == 404
        assert json.loads(refused["body"])["error"]["code"] == "not_found"


def test_a_guest_reads_their_own_answer_by_their_cookie_only(guest):
    answer = _answer(guest_key=guests.guest_key_in({guests.COOKIE: guest.cookies[guests.COOKIE].value}))
    _publish_answer(answer, "Hello.")
    assert _get(answer, _cookies(guest))["status"] == 200
    forged = [(b"cookie", f"{guests.COOKIE}=someone-else:forged".encode())]
    assert _get(answer, forged)["status"] == 404


@pytest.mark.security
def test_a_session_from_before_a_password_change_reads_nothing():
    alice = User.objects.create_user("alice", password="pw")
    answer = _answer(owner=alice)
    _publish_answer(answer, "Hi.")
    cookies = _cookies(_signed_in(alice))
    alice.set_password("a new one")
    alice.save()
    assert _get(answer, cookies)["status"] == 404


def test_only_get_reads_a_stream():
    alice = User.objects.create_user("alice", password="pw")
    response = _get(_answer(owner=alice), _cookies(_signed_in(alice)), method="POST")
    assert response["status"] == 405
    assert dict(response["headers"])[b"allow"] == b"GET"


def test_a_client_that_leaves_stops_counting_as_a_watcher():
    alice = User.objects.create_user("alice", password="pw")
    answer = _answer(owner=alice)  # nothing published: the stream stays open, waiting
    watchers = keys.watchers(MODEL, str(answer.generation_id))
    cookies = _cookies(_signed_in(alice))

    async def open_then_leave() -> tuple[str | None, str | None]:
        scope = {
            "type": "http",
            "method": "GET",
            "path": stream_url(answer.generation_id),
            "query_string": b"",
            "headers": cookies,
        }
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "http.request", "body": b""})
        start = await communicator.receive_output(DEADLINE_S)
        assert start["status"] == 200
        await communicator.receive_output(DEADLINE_S)  # the first frame: the stream is followed
        watching = sync_redis().hget(watchers, "clients")
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(DEADLINE_S)
        return watching, sync_redis().hget(watchers, "clients")

    watching, after = asyncio.run(open_then_leave())
    assert (watching, after) == ("1", "0")


def _open(answer: Message, cookies: list[tuple[bytes, bytes]], address: str) -> ApplicationCommunicator:
    scope = {
        "type": "http",
        "method": "GET",
        "path": stream_url(answer.generation_id),
        "query_string": b"",
        "headers": cookies,
        "client": (address, 40000),
    }
    return ApplicationCommunicator(application, scope)


async def _status(communicator: ApplicationCommunicator) -> int:
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(DEADLINE_S)
    if start["status"] == 200:
        await communicator.receive_output(DEADLINE_S)  # its first frame: it is followed
    return start["status"]


async def _close(communicator: ApplicationCommunicator) -> None:
    await communicator.send_input({"type": "http.disconnect"})
    await communicator.wait(DEADLINE_S)


@pytest.mark.security
def test_a_client_opening_stream_after_stream_is_refused_while_others_keep_theirs(settings):
    settings.STREAMS_MAX_PER_CLIENT = 3
    alice, bob = (
        User.objects.create_user("alice", password="pw"),
        User.objects.create_user("bob", password="pw"),
    )
    alices, bobs = _answer(owner=alice), _answer(owner=bob)  # nothing published: streams stay open
    alice_cookies, bob_cookies = _cookies(_signed_in(alice)), _cookies(_signed_in(bob))

    async def flood() -> tuple[list[int], int, int]:
        opened = [_open(alices, alice_cookies, f"198.51.100.{n}") for n in range(4)]
        statuses = [await _status(stream) for stream in opened]
        bobs_stream = _open(bobs, bob_cookies, "203.0.113.1")
        bobs_status = await _status(bobs_stream)
        await _close(opened[0])
        again = _open(alices, alice_cookies, "198.51.100.9")
        again_status = await _status(again)
        for stream in [*opened[1:3], bobs_stream, again]:
            await _close(stream)
        return statuses, bobs_status, again_status

    statuses, bobs_status, again_status = asyncio.run(flood())
    assert statuses == [200, 200, 200, 429]
    assert bobs_status == 200  # another customer's stream is not held up
    assert again_status == 200  # a stream closed gives its place back


@pytest.mark.security
def test_one_address_opening_streams_for_many_guests_is_refused_past_its_cap(settings):
    settings.STREAMS_MAX_PER_ADDRESS = 2
    visitors = [Client() for _ in range(3)]
    for visitor in visitors:
        visitor.get("/")  # each a guest with a cookie of their own
    answers = [
        _answer(guest_key=guests.guest_key_in({guests.COOKIE: visitor.cookies[guests.COOKIE].value}))
        for visitor in visitors
    ]

    async def flood() -> list[int]:
        opened = [
            _open(answer, _cookies(visitor), "2001:db8:0:7::1")
            for answer, visitor in zip(answers, visitors, strict=True)
        ]
        statuses = [await _status(stream) for stream in opened]
        elsewhere = _open(answers[2], _cookies(visitors[2]), "2001:db8:0:8::1")
        statuses.append(await _status(elsewhere))
        for stream in [*opened[:2], elsewhere]:
            await _close(stream)
        return statuses

    assert asyncio.run(flood()) == [200, 200, 429, 200]
