"""One message, end to end, through real processes: redis, daphne, the inference worker."""

import asyncio

import pytest

from tests.e2e.client import ChatClient

pytestmark = pytest.mark.e2e


async def _signed_in(stack, username: str, password: str) -> ChatClient:
    client = ChatClient(stack.base_url)
    await client.login(username, password)
    return client


def test_twenty_concurrent_messages_from_normal_and_vip_all_complete_in_order(stack):
    async def scenario():
        alice = await _signed_in(stack, "alice", "alice-demo-pass")
        victor = await _signed_in(stack, "victor", "victor-demo-pass")
        async with alice, victor:

            async def ask(client: ChatClient, n: int):
                conversation = await client.new_conversation()
                request_id = await client.ask(conversation, f"Question number {n} about my order")
                return request_id, await client.stream(request_id)

            return await asyncio.gather(*(ask(alice if n % 2 else victor, n) for n in range(20)))

    results = asyncio.run(scenario())
    for request_id, result in results:
        tokens = result.of("token")
        assert [t.data["seq"] for t in tokens] == list(range(len(tokens)))
        assert result.terminal.event == "done"
        assert result.terminal.data["finish_reason"] in {"stop", "length"}
        assert result.text.startswith("[simulated] You asked: Question number")
        assert stack.count_assistant_messages(request_id) == [("done", result.text)]


def test_a_dropped_stream_resumed_with_last_event_id_yields_exactly_the_answer(stack):
    async def scenario():
        async with ChatClient(stack.base_url) as guest:
            conversation = await guest.open_page()
            request_id = await guest.ask(conversation, "Where is my parcel?")
            first = await guest.stream(request_id, stop_after_tokens=5)
            second = await guest.stream(request_id, last_event_id=first.last_id)
            whole = await guest.stream(request_id)
            return request_id, first, second, whole

    request_id, first, second, whole = asyncio.run(scenario())
    assert len(first.of("token")) == 5
    assert second.of("token")[0].data["seq"] == 5
    assert first.text + second.text == whole.text
    assert whole.terminal.event == "done"
    assert stack.count_assistant_messages(request_id) == [("done", whole.text)]


def test_every_event_carries_an_id_and_a_malformed_last_event_id_replays_from_the_start(stack):
    async def scenario():
        async with ChatClient(stack.base_url) as guest:
            conversation = await guest.open_page()
            request_id = await guest.ask(conversation, "Hello")
            complete = await guest.stream(request_id)
            garbled = await guest.stream(request_id, last_event_id="not-an-id")
            return complete, garbled

    complete, garbled = asyncio.run(scenario())
    assert all(event.id for event in complete.events)
    assert garbled.text == complete.text != ""


@pytest.mark.security
def test_another_clients_request_id_is_not_found(stack):
    async def scenario():
        async with ChatClient(stack.base_url) as owner, ChatClient(stack.base_url) as stranger:
            conversation = await owner.open_page()
            request_id = await owner.ask(conversation, "My account number is 1234")
            await stranger.open_page()
            stream = await stranger.http.get(f"/chat/stream/{request_id}")
            cancel = await stranger.cancel(request_id)
            post = await stranger.post_message(conversation, "let me in")
            await owner.stream(request_id)
            return stream.status_code, cancel.status_code, post.status_code

    assert asyncio.run(scenario()) == (404, 404, 404)
