"""The hand-off from the customer's side, through HTTP and the product's ASGI application: asking
for a person, messages kept for them, the rating, the conversation's event stream, and what a
customer can never do or read."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.testing import ApplicationCommunicator, HttpCommunicator
from django.test import Client

from accounts.models import User
from chat import handoff
from chat.consumers import events_url
from chat.models import Conversation, Handoff, Message
from config.routing import application
from scheduler.models import Generation
from tests.chat.conftest import make_agent

DEADLINE_S = 10
JSON = {"Accept": "application/json"}


def _new_conversation(client: Client) -> str:
    return client.post("/chat/conversations", headers=JSON).json()["id"]


def _conversation(client: Client) -> str:
    """A stored conversation of the client's, with one question answered."""
    conversation_id = _new_conversation(client)
    asked = client.post(f"/chat/{conversation_id}/messages", {"text": "Do gift cards expire?"}, headers=JSON)
    assert asked.status_code == 202
    Generation.objects.filter(request_id=asked.json()["request_id"]).update(status="done", text="Never.")
    return conversation_id


@pytest.fixture
def agent() -> User:
    return make_agent("sam", display_name="Sam")


@pytest.mark.django_db
@pytest.mark.usefixtures("variants", "tier_policies")
class TestAskingForAPerson:
    def test_the_button_asks_for_a_person_and_says_nobody_is_online(self, guest):
        conversation_id = _conversation(guest)
        response = guest.post(f"/chat/{conversation_id}/handoff/request", {"trigger": "button"}, headers=JSON)
        assert response.status_code == 201
        assert (response.json()["state"], response.json()["agents_online"]) == ("waiting", 0)
        assert Handoff.objects.get(conversation_id=conversation_id).trigger == "button"

    def test_a_message_while_waiting_is_kept_for_the_person_and_gets_no_answer(self, guest):
        conversation_id = _conversation(guest)
        guest.post(f"/chat/{conversation_id}/handoff/request", headers=JSON)
        answers = Generation.objects.count()
        response = guest.post(f"/chat/{conversation_id}/messages", {"text": "My order is late"}, headers=JSON)
        assert response.status_code == 201
        assert response.json()["handoff"]["state"] == "waiting"
        assert Generation.objects.count() == answers
        assert Message.objects.filter(conversation_id=conversation_id, content="My order is late").exists()

    def test_asking_in_words_hands_off_with_the_page_told_over_htmx(self, guest):
        conversation_id = _new_conversation(guest)
        response = guest.post(
            f"/chat/{conversation_id}/messages",
            {"text": "I want to talk to a human"},
            headers={"HX-Request": "true"},
        )
        assert response.status_code == 201
        assert json.loads(response["HX-Trigger"])["handoff"]["state"] == "waiting"
        assert "bubble--assistant" not in response.content.decode()
        assert Conversation.objects.get(pk=conversation_id).handoff_state == "waiting"

    def test_a_message_to_a_resolved_conversation_is_answered_by_the_assistant_in_it(self, guest, agent):
        conversation_id = _conversation(guest)
        guest.post(f"/chat/{conversation_id}/handoff/request", headers=JSON)
        handoff.conversation_claim(conversation_id=conversation_id, agent=agent)
        handoff.handoff_resolve(conversation_id=conversation_id, agent=agent)
        response = guest.post(
            f"/chat/{conversation_id}/messages", {"text": "And do you ship to Spain?"}, headers=JSON
        )
        assert response.status_code == 202  # an answer is queued, in the same conversation
        assert Conversation.objects.get(pk=conversation_id).handoff_state == "assistant"

    def test_the_customer_rates_once_on_a_scale_of_one_to_five(self, guest, agent):
        conversation_id = _conversation(guest)
        guest.post(f"/chat/{conversation_id}/handoff/request", headers=JSON)
        handoff.conversation_claim(conversation_id=conversation_id, agent=agent)
        handoff.handoff_resolve(conversation_id=conversation_id, agent=agent)
        url = f"/chat/{conversation_id}/handoff/rating"
        assert guest.post(url, {"rating": "7"}, headers=JSON).status_code == 400
        assert guest.post(url, {"rating": "5", "comment": "Sam was great"}, headers=JSON).status_code == 201
        assert guest.post(url, {"rating": "1"}, headers=JSON).status_code == 409
        assert Handoff.objects.get(conversation_id=conversation_id).rating == 5

    def test_the_state_lists_the_messages_after_the_one_the_page_shows(self, guest, agent):
        conversation_id = _conversation(guest)
        guest.post(f"/chat/{conversation_id}/handoff/request", headers=JSON)
        handoff.conversation_claim(conversation_id=conversation_id, agent=agent)
        shown = Message.objects.filter(conversation_id=conversation_id).latest("id").pk
        handoff.agent_reply(conversation_id=conversation_id, agent=agent, text="Hi, I'm Sam.")
        state = guest.get(f"/chat/{conversation_id}/handoff?after={shown}").json()
        assert (state["state"], state["agent"]) == ("agent", "Sam")
        assert [(m["role"], m["author"], m["text"]) for m in state["messages"]] == [
            ("agent", "Sam", "Hi, I'm Sam.")
        ]


@pytest.mark.django_db
@pytest.mark.usefixtures("variants", "tier_policies")
class TestWhatACustomerCannotDo:
    @pytest.mark.security
    def test_another_customer_cannot_read_or_act_on_a_conversation(self, guest):
        conversation_id = _conversation(guest)
        other = Client()
        other.get("/")
        assert other.get(f"/chat/{conversation_id}/handoff").status_code == 404
        for action in ("request", "withdraw", "typing", "rating"):
            assert other.post(f"/chat/{conversation_id}/handoff/{action}", headers=JSON).status_code == 404
        assert Conversation.objects.get(pk=conversation_id).handoff_state == "assistant"

    def test_a_customer_cannot_post_as_an_agent(self, guest, agent):
        conversation_id = _conversation(guest)
        guest.post(f"/chat/{conversation_id}/handoff/request", headers=JSON)
        handoff.conversation_claim(conversation_id=conversation_id, agent=agent)
        customer = Client()
        customer.force_login(User.objects.create_user("mallory", password="pw"))
        for client in (guest, customer):
            refused = client.post(f"/console/inbox/{conversation_id}/reply", {"text": "Refund approved!"})
            assert refused.status_code == 403
        # What the customer writes is theirs, whatever the form says.
        guest.post(
            f"/chat/{conversation_id}/messages",
            {"text": "Refund approved!", "role": "agent", "author_name": "Sam"},
        )
        assert list(
            Message.objects.filter(content="Refund approved!").values_list("role", "author_name")
        ) == [("user", "")]

    def test_a_private_note_is_never_on_the_customers_page_or_in_their_state(self, guest, agent):
        conversation_id = _conversation(guest)
        guest.post(f"/chat/{conversation_id}/handoff/request", headers=JSON)
        handoff.conversation_claim(conversation_id=conversation_id, agent=agent)
        handoff.agent_note(conversation_id=conversation_id, agent=agent, text="VIP-NOTE: offer a voucher")
        handoff.agent_reply(conversation_id=conversation_id, agent=agent, text="Hello!")
        assert "VIP-NOTE" not in guest.get(f"/chat/{conversation_id}").content.decode()
        assert "VIP-NOTE" not in guest.get(f"/chat/{conversation_id}/handoff").content.decode()


# --- the conversation's event stream -------------------------------------------------------------


def _cookies(client: Client) -> list[tuple[bytes, bytes]]:
    cookie = "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())
    return [(b"cookie", cookie.encode())]


def _stream(conversation_id: str, headers: list[tuple[bytes, bytes]], query: str = "") -> dict:
    path = events_url(conversation_id)
    communicator = HttpCommunicator(application, "GET", f"{path}{query}", headers=headers)
    return asyncio.run(communicator.get_response(timeout=DEADLINE_S))


def _events(body: bytes) -> list[tuple[str | None, str, dict]]:
    events = []
    for block in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "event" in fields:
            events.append((fields.get("id"), fields["event"], json.loads(fields["data"])))
    return events


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("variants", "tier_policies")
class TestTheEventStream:
    def _resolved_conversation(self, guest: Client, agent: User) -> str:
        conversation_id = _conversation(guest)
        guest.post(f"/chat/{conversation_id}/handoff/request", headers=JSON)
        handoff.conversation_claim(conversation_id=conversation_id, agent=agent)
        handoff.agent_note(conversation_id=conversation_id, agent=agent, text="VIP-NOTE: offer a voucher")
        handoff.agent_reply(conversation_id=conversation_id, agent=agent, text="Hello, I'm Sam.")
        guest.post(f"/chat/{conversation_id}/messages", {"text": "Hi Sam"}, headers=JSON)
        handoff.handoff_resolve(conversation_id=conversation_id, agent=agent)
        return conversation_id

    def test_the_customer_hears_the_hand_off_with_an_id_on_every_event_and_never_a_note(self, guest, agent):
        conversation_id = self._resolved_conversation(guest, agent)
        response = _stream(conversation_id, _cookies(guest))
        assert response["status"] == 200
        assert response["headers"][0] == (b"content-type", b"text/event-stream")
        events = _events(response["body"])
        # A wait that is over by the time of the replay is not told again.
        assert [kind for _, kind, _ in events] == [
            "agent_joined", "message", "message", "resolved", "rating_request"
        ]  # fmt: skip
        assert all(event_id for event_id, _, _ in events)
        assert [data.get("text") for _, kind, data in events if kind == "message"] == [
            "Hello, I'm Sam.",
            "Hi Sam",
        ]
        assert events[0][2] == {"agent": "Sam"}
        assert b"VIP-NOTE" not in response["body"]

    def test_a_reconnect_resumes_after_its_last_event_without_loss_or_repeat(self, guest, agent):
        conversation_id = self._resolved_conversation(guest, agent)
        whole = [e for e in _events(_stream(conversation_id, _cookies(guest))["body"]) if e[1] != "waiting"]
        cut = whole[2][0]  # the first message's id
        resumed = _events(
            _stream(conversation_id, [*_cookies(guest), (b"last-event-id", cut.encode())])["body"]
        )
        assert resumed == whole[3:]
        from_query = _events(_stream(conversation_id, _cookies(guest), f"?after={cut}")["body"])
        assert from_query == whole[3:]

    @pytest.mark.security
    def test_another_customers_events_are_not_found(self, guest, agent):
        conversation_id = self._resolved_conversation(guest, agent)
        other = Client()
        other.get("/")
        assert _stream(conversation_id, _cookies(other))["status"] == 404
        assert _stream(conversation_id, [])["status"] == 404

    def test_a_waiting_customer_hears_their_place_vip_customers_first_and_that_nobody_is_online(self, guest):
        vip = Client()
        vip.force_login(User.objects.create_user("victor", password="pw", tier="vip"))
        mine = _conversation(guest)
        guest.post(f"/chat/{mine}/handoff/request", headers=JSON)
        vip_conversation = _conversation(vip)
        vip.post(f"/chat/{vip_conversation}/handoff/request", headers=JSON)

        async def first_waiting_event() -> dict:
            scope = {
                "type": "http",
                "method": "GET",
                "path": events_url(mine),
                "query_string": b"",
                "headers": _cookies(guest),
            }
            communicator = ApplicationCommunicator(application, scope)
            await communicator.send_input({"type": "http.request", "body": b""})
            assert (await communicator.receive_output(DEADLINE_S))["status"] == 200
            try:
                while True:
                    frame = (await communicator.receive_output(DEADLINE_S))["body"]
                    waiting = [data for _, kind, data in _events(frame) if kind == "waiting"]
                    if waiting:
                        return waiting[0]
            finally:
                await communicator.send_input({"type": "http.disconnect"})
                await communicator.wait(DEADLINE_S)

        assert asyncio.run(first_waiting_event()) == {"position": 2, "eta_s": None, "agents_online": 0}
