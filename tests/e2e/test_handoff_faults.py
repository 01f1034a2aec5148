"""The hand-off through faults, with real processes: the web process an agent and a customer
talk through is killed mid-conversation, and Redis restarts with ten customers waiting."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.e2e.client import ChatClient
from tests.e2e.conftest import running_stack

pytestmark = pytest.mark.e2e

DEADLINE_S = 60


@pytest.fixture(scope="module")
def stack():
    for stack in running_stack(SIMULATED_OUTPUT_TOKENS="8"):
        done = stack.manage("agent", "sam", "--display-name", "Sam", "--capacity", "20")
        assert done.returncode == 0, done.stderr
        yield stack


class Agent(ChatClient):
    async def act(self, conversation_id: str, action: str, text: str | None = None) -> httpx.Response:
        return await self.http.post(
            f"/console/inbox/{conversation_id}/{action}",
            data={} if text is None else {"text": text},
            headers={"X-CSRFToken": self.csrf, "Accept": "application/json"},
        )


async def _agent(stack) -> Agent:
    agent = Agent(stack.base_url)
    await agent.login("sam", stack.staff_password)
    return agent


async def _waiting_customer(stack, question: str) -> tuple[ChatClient, str]:
    customer = ChatClient(stack.base_url)
    conversation_id = await customer.new_conversation()
    await customer.ask(conversation_id, question)
    response = await customer.http.post(
        f"/chat/{conversation_id}/handoff/request",
        headers={"X-CSRFToken": customer.csrf, "Accept": "application/json"},
    )
    assert response.status_code == 201, response.text
    return customer, conversation_id


async def _follow(
    customer: ChatClient, conversation_id: str, *, until, after: str = "0-0"
) -> list[tuple[str, str, dict]]:
    """The conversation's events as an EventSource reads them: a broken connection is opened
    again with Last-Event-ID, until `until(events)` holds."""
    events: list[tuple[str, str, dict]] = []
    last_id = after
    deadline = time.monotonic() + DEADLINE_S
    while not until(events):
        assert time.monotonic() < deadline, f"gave up with {events}"
        try:
            async with (
                httpx.AsyncClient(
                    base_url=customer.http.base_url, cookies=customer.http.cookies, timeout=30
                ) as http,
                http.stream(
                    "GET", f"/chat/{conversation_id}/events", headers={"Last-Event-ID": last_id}
                ) as response,
            ):
                fields: dict[str, str] = {}
                async for line in response.aiter_lines():
                    if line == "" and "event" in fields:
                        events.append((fields["id"], fields["event"], json.loads(fields["data"])))
                        last_id = fields["id"]
                        if until(events):
                            return events
                    if line == "":
                        fields = {}
                    elif not line.startswith(":"):
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
        except httpx.HTTPError:
            await asyncio.sleep(0.2)  # the web process is gone: the browser tries again
    return events


def _agent_messages(events: list[tuple[str, str, dict]]) -> list[str]:
    return [data["text"] for _, kind, data in events if kind == "message" and data["role"] == "agent"]


def test_an_agents_web_process_killed_mid_conversation_loses_nothing_the_agent_sent(stack):
    replies = [f"Update {n} on your parcel." for n in range(10)]

    async def scenario() -> tuple[list, dict]:
        agent = await _agent(stack)
        customer, conversation_id = await _waiting_customer(stack, "Where is parcel 4411?")
        async with agent, customer:
            assert (await agent.act(conversation_id, "claim")).status_code == 200
            following = asyncio.create_task(
                _follow(
                    customer,
                    conversation_id,
                    until=lambda events: len(_agent_messages(events)) == len(replies),
                )
            )
            for text in replies[:5]:
                assert (await agent.act(conversation_id, "reply", text)).status_code == 201
            stack.web.kill()  # SIGKILL, mid-conversation: nothing is handed on
            await asyncio.to_thread(stack.start_web)
            for text in replies[5:]:
                assert (await agent.act(conversation_id, "reply", text)).status_code == 201
            events = await asyncio.wait_for(following, DEADLINE_S)
            state = (await customer.http.get(f"/chat/{conversation_id}/handoff?after=0")).json()
            return events, state

    events, state = asyncio.run(scenario())
    assert _agent_messages(events) == replies  # all of them, in order, none twice
    ids = [event_id for event_id, _, _ in events]
    assert len(ids) == len(set(ids))
    assert [m["text"] for m in state["messages"] if m["role"] == "agent"] == replies
    assert {m["author"] for m in state["messages"] if m["role"] == "agent"} == {"Sam"}


def test_a_redis_restart_with_ten_customers_waiting_loses_none_of_them(stack):
    async def scenario() -> tuple[dict, list, list]:
        agent = await _agent(stack)
        waiting = [await _waiting_customer(stack, f"Question {n} about my order") for n in range(10)]
        follows = [
            asyncio.create_task(
                _follow(
                    customer,
                    conversation_id,
                    until=lambda events: any(e[1] == "agent_joined" for e in events),
                )
            )
            for customer, conversation_id in waiting
        ]
        await asyncio.sleep(0.5)  # the customers' pages are following their conversations
        await asyncio.to_thread(stack.redis.restart, 1.0)
        async with agent:
            inbox = (
                await agent.http.get("/console/inbox/snapshot", headers={"Accept": "application/json"})
            ).json()
            claims = [
                (await agent.act(conversation_id, "claim")).status_code for _, conversation_id in waiting
            ]
            heard = await asyncio.wait_for(asyncio.gather(*follows), DEADLINE_S)
        for customer, _ in waiting:
            await customer.http.aclose()
        return inbox, claims, heard

    inbox, claims, heard = asyncio.run(scenario())
    ours = [row for row in inbox["waiting"] if row["title"].startswith("Question ")]
    assert len(ours) == 10
    assert claims == [200] * 10
    assert all(any(kind == "agent_joined" for _, kind, _ in events) for events in heard)
