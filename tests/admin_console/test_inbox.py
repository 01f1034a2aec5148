"""The agents' inbox through HTTP: only agents act, each action is audited, claims race cleanly,
what the inbox lists and offers, and the transcript the team reads."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connection
from django.test import Client
from django.utils import timezone

from accounts.models import User
from admin_console.models import AuditLog
from chat import handoff
from chat.handoff_selectors import inbox_snapshot, offers
from chat.models import AgentNote, AgentProfile, Conversation, Handoff, Message
from chat.presence import agents_online, presence_beat
from config.routing import application
from tests.chat.conftest import make_agent
from tests.generation_jobs import generation_record

CONVERSATION = "6f1c2a52-93a4-4a43-9f0e-3c1d0c2b7a10"
ACTIONS = ["claim", "reply", "note", "hand-back", "resolve"]
JSON = {"Accept": "application/json"}


def _signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _waiting(*, vip: bool = False, owner: User | None = None, ago_s: float = 0) -> Conversation:
    conversation = Conversation.objects.create(owner=owner, session_key="" if owner else f"g-{vip}-{ago_s}")
    Message.objects.create(conversation=conversation, role=Message.Role.USER, content="Where is my parcel?")
    handoff.handoff_request(
        conversation=conversation, trigger=Handoff.Trigger.BUTTON, tier="vip" if vip else "normal"
    )
    Handoff.objects.filter(conversation=conversation).update(
        requested_at=timezone.now() - timedelta(seconds=ago_s)
    )
    return conversation


@pytest.fixture
def sam() -> User:
    return make_agent("sam", display_name="Sam")


@pytest.mark.django_db
class TestOnlyAgents:
    @pytest.mark.parametrize("action", ACTIONS)
    def test_staff_without_the_agent_permission_get_403_on_every_action(self, action):
        staff = _signed_in(User.objects.create_user("boss", password="pw", is_staff=True))
        conversation = _waiting()
        response = staff.post(f"/console/inbox/{conversation.pk}/{action}", {"text": "hi"}, headers=JSON)
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "not_an_agent"
        assert Conversation.objects.get(pk=conversation.pk).handoff_state == "waiting"
        assert not AuditLog.objects.exists()

    @pytest.mark.parametrize(
        "url", ["/console/inbox", "/console/inbox/snapshot", f"/console/inbox/{CONVERSATION}"]
    )
    def test_staff_without_the_agent_permission_cannot_read_the_inbox(self, url):
        staff = _signed_in(User.objects.create_user("boss", password="pw", is_staff=True))
        page = staff.get(url)
        assert page.status_code == 403
        assert b"agent permission" in page.content
        assert staff.get(url, headers=JSON).status_code == 403

    def test_the_profile_and_target_forms_are_the_agents_too(self):
        staff = _signed_in(User.objects.create_user("boss", password="pw", is_staff=True))
        assert (
            staff.post("/console/inbox/profile", {"display_name": "Boss", "capacity": 3}).status_code == 403
        )
        assert staff.post("/console/inbox/target", {"first_response_target_s": 30}).status_code == 403


@pytest.mark.django_db
class TestActions:
    def test_claim_reply_note_and_resolve_are_each_audited(self, sam):
        agent = _signed_in(sam)
        conversation = _waiting()
        url = f"/console/inbox/{conversation.pk}"
        assert agent.post(f"{url}/claim", headers=JSON).status_code == 200
        assert agent.post(f"{url}/reply", {"text": "Hello, I'm Sam."}, headers=JSON).status_code == 201
        assert agent.post(f"{url}/note", {"text": "wants a refund"}, headers=JSON).status_code == 201
        assert agent.post(f"{url}/resolve", headers=JSON).status_code == 200
        audit = list(AuditLog.objects.order_by("id").values_list("action", "actor_name", "target"))
        assert audit == [
            (action, "sam", str(conversation.pk))
            for action in ("handoff.claim", "handoff.reply", "handoff.note", "handoff.resolve")
        ]

    def test_hand_back_is_audited(self, sam):
        agent = _signed_in(sam)
        conversation = _waiting()
        agent.post(f"/console/inbox/{conversation.pk}/claim", headers=JSON)
        assert agent.post(f"/console/inbox/{conversation.pk}/hand-back", headers=JSON).status_code == 200
        assert AuditLog.objects.filter(action="handoff.hand_back").exists()
        assert Conversation.objects.get(pk=conversation.pk).handoff_state == "assistant"

    def test_the_second_of_two_claims_gets_a_clear_409(self, sam):
        ana = make_agent("ana", display_name="Ana")
        conversation = _waiting()
        assert (
            _signed_in(sam).post(f"/console/inbox/{conversation.pk}/claim", headers=JSON).status_code == 200
        )
        lost = _signed_in(ana).post(f"/console/inbox/{conversation.pk}/claim", headers=JSON)
        assert lost.status_code == 409
        assert lost.json()["error"]["message"] == "Another agent is answering this conversation already."
        assert AuditLog.objects.filter(action="handoff.claim").count() == 1

    @pytest.mark.parametrize(
        ("text", "says"), [("", "Type a message first."), ("x" * 4001, "at most 4000 characters")]
    )
    def test_an_empty_or_over_long_message_gets_a_clear_400(self, sam, text, says):
        agent = _signed_in(sam)
        conversation = _waiting()
        agent.post(f"/console/inbox/{conversation.pk}/claim", headers=JSON)
        for kind in ("reply", "note"):
            refused = agent.post(f"/console/inbox/{conversation.pk}/{kind}", {"text": text}, headers=JSON)
            assert refused.status_code == 400
            assert says in refused.json()["error"]["message"]
        assert not AuditLog.objects.filter(action__in=["handoff.reply", "handoff.note"]).exists()

    def test_an_agent_sets_the_name_customers_see(self, sam):
        agent = _signed_in(sam)
        agent.post("/console/inbox/profile", {"display_name": "Samantha", "capacity": 5})
        assert AgentProfile.objects.get(user=sam).display_name == "Samantha"
        assert AuditLog.objects.get(action="agent.profile").after == {
            "display_name": "Samantha",
            "capacity": 5,
        }
        conversation = _waiting()
        agent.post(f"/console/inbox/{conversation.pk}/claim", headers=JSON)
        reply = agent.post(f"/console/inbox/{conversation.pk}/reply", {"text": "Hi"}, headers=JSON).json()
        assert reply["author"] == "Samantha"


@pytest.mark.skipif(
    settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql",
    # The suite's in-memory SQLite fails concurrent writers at once (a database file lets them
    # wait): the browser test claims at once on the real stack's SQLite.
    reason="concurrent writers need PostgreSQL here (run with --database postgres)",
)
@pytest.mark.django_db(transaction=True)
def test_two_agents_claiming_at_the_same_moment_one_wins_and_the_other_gets_409():
    sam, ana = make_agent("sam", display_name="Sam"), make_agent("ana", display_name="Ana")
    conversation = _waiting()
    start = threading.Barrier(2)
    outcomes: dict[str, int] = {}

    def claim(agent: User) -> None:
        client = _signed_in(agent)
        start.wait()
        try:
            outcomes[agent.username] = client.post(
                f"/console/inbox/{conversation.pk}/claim", headers=JSON
            ).status_code
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(agent,)) for agent in (sam, ana)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes.values()) == [200, 409]
    winner = next(name for name, status in outcomes.items() if status == 200)
    assert Conversation.objects.get(pk=conversation.pk).assignee.username == winner
    assert Handoff.objects.get(conversation=conversation).agent.username == winner


# --- what the inbox shows ---------------------------------------------------------------------


@pytest.mark.django_db
class TestTheInbox:
    def test_waiting_conversations_come_vip_first_then_oldest(self, sam):
        oldest = _waiting(ago_s=300)
        newer = _waiting(ago_s=60)
        vip = _waiting(vip=True, ago_s=10)
        snapshot = inbox_snapshot(agent=sam)
        assert [row["id"] for row in snapshot["waiting"]] == [str(vip.pk), str(oldest.pk), str(newer.pk)]
        assert snapshot["waiting"][0]["vip"] is True

    def test_waiting_conversations_are_offered_to_the_least_loaded_online_agent_with_room(self):
        waiting = ["c1", "c2", "c3", "c4"]
        # Agent 1 answers two of three, agent 2 one of two, agent 3 none of one.
        offered = offers(waiting=waiting, agents={1: (2, 3), 2: (1, 2), 3: (0, 1)})
        assert offered == {"c1": 3, "c2": 2, "c3": 1}  # then nobody has room for c4

    def test_an_agent_whose_tab_stopped_beating_is_away(self, sam, settings):
        presence_beat(agent_id=sam.pk, tab_id="tab-1")
        assert agents_online() == {sam.pk}
        settings.HANDOFF_PRESENCE_TTL_S = 0
        assert agents_online() == set()

    def test_the_inbox_offers_a_waiting_conversation_to_the_agent_online_with_room(self, sam):
        ana = make_agent("ana", display_name="Ana")
        presence_beat(agent_id=sam.pk, tab_id="tab")
        presence_beat(agent_id=ana.pk, tab_id="tab")
        busy = _waiting()
        handoff.conversation_claim(conversation_id=busy.pk, agent=sam)
        waiting = _waiting()
        row = inbox_snapshot(agent=ana)["waiting"][0]
        assert (row["id"], row["offered_to_me"]) == (str(waiting.pk), True)
        assert inbox_snapshot(agent=sam)["waiting"][0]["offered_to"] == "Ana"
        assert [r["id"] for r in inbox_snapshot(agent=sam)["mine"]] == [str(busy.pk)]

    def test_the_transcript_has_answers_with_sources_and_thumbs_notes_and_earlier_conversations(self, sam):
        alice = User.objects.create_user("alice", password="pw")
        earlier = Conversation.objects.create(owner=alice)
        Message.objects.create(conversation=earlier, role=Message.Role.USER, content="Do you ship to Canada?")
        Conversation.objects.filter(pk=earlier.pk).update(created_at=timezone.now() - timedelta(days=2))
        conversation = Conversation.objects.create(owner=alice)
        Message.objects.create(
            conversation=conversation, role=Message.Role.USER, content="Can I return a sofa?"
        )
        Message.objects.create(
            conversation=conversation,
            role=Message.Role.ASSISTANT,
            generation=generation_record(status="done", text="Yes, within 30 days."),
            sources=[{"slug": "returns-policy", "title": "Returns"}],
            feedback=Message.Feedback.DOWN,
        )
        handoff.handoff_request(conversation=conversation, trigger=Handoff.Trigger.THUMBS_DOWN, tier="normal")
        handoff.conversation_claim(conversation_id=conversation.pk, agent=sam)
        handoff.agent_note(conversation_id=conversation.pk, agent=sam, text="Freight return: $59")
        transcript = _signed_in(sam).get(f"/console/inbox/{conversation.pk}", headers=JSON).json()
        answer = next(m for m in transcript["messages"] if m["role"] == "assistant")
        assert (answer["text"], answer["feedback"]) == ("Yes, within 30 days.", -1)
        assert answer["sources"] == [{"slug": "returns-policy", "title": "Returns"}]
        assert [n["text"] for n in transcript["notes"]] == ["Freight return: $59"]
        assert transcript["handoffs"][0]["trigger"] == "Offered after a second thumbs-down"
        assert [e["title"] for e in transcript["earlier"]] == ["Do you ship to Canada?"]
        assert AgentNote.objects.count() == 1


# --- the socket ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_inbox_socket_refuses_staff_who_are_not_agents_and_pushes_agents_their_inbox_as_data():
    staff = User.objects.create_user("boss", password="pw", is_staff=True)
    sam = make_agent("sam", display_name="Sam")

    def cookie_of(user: User) -> bytes:
        client = _signed_in(user)
        return "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items()).encode()

    async def connect(cookie: bytes) -> tuple[bool, dict | None]:
        communicator = WebsocketCommunicator(
            application,
            "/console/inbox/socket",
            headers=[(b"cookie", cookie), (b"origin", b"http://localhost")],
        )
        connected, _ = await communicator.connect(timeout=10)
        first = await communicator.receive_json_from(timeout=10) if connected else None
        await communicator.disconnect()
        return connected, first

    assert asyncio.run(connect(cookie_of(staff))) == (False, None)
    connected, first = asyncio.run(connect(cookie_of(sam)))
    assert connected
    assert first["type"] == "inbox"
    assert first["me"]["display_name"] == "Sam"
    assert first["me"]["online"] is True  # the open tab is the agent's presence
    assert agents_online() == set()  # and closing it leaves at once
