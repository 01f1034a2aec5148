"""The hand-off's state machine (chat.handoff): every state and transition of
docs/ARCHITECTURE.md ("Hand-off to a person"), what each records, and what the customer's stream
hears of it."""

from __future__ import annotations

import json

import pytest

from accounts.models import User
from chat import handoff
from chat.handoff import TRANSITIONS, Action, HandoffConflict, HandoffRejected, NotAnAgent, State
from chat.models import AgentNote, AgentProfile, Conversation, Handoff, Message
from chat.presence import presence_beat
from scheduler import keys
from scheduler.redis import sync_redis
from tests.chat.conftest import make_agent

pytestmark = pytest.mark.django_db


def stream_events(conversation: Conversation) -> list[tuple[str, dict]]:
    entries = sync_redis().xrange(keys.conversation_events(str(conversation.pk)))
    return [(fields["type"], json.loads(fields["data"])) for _, fields in entries]


@pytest.fixture
def conversation() -> Conversation:
    return Conversation.objects.create(session_key="guest-key")


@pytest.fixture
def agent() -> User:
    return make_agent("sam", display_name="Sam")


@pytest.fixture
def publish(django_capture_on_commit_callbacks):
    """Run what waits for the commit (the events) as a real commit would."""

    def run(action, *args, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return action(*args, **kwargs)

    return run


def waiting(conversation: Conversation, *, vip: bool = False) -> Handoff:
    return handoff.handoff_request(
        conversation=conversation, trigger=Handoff.Trigger.BUTTON, tier="vip" if vip else "normal"
    ).handoff


def with_agent(conversation: Conversation, agent: User) -> None:
    waiting(conversation)
    handoff.conversation_claim(conversation_id=conversation.pk, agent=agent)


def state_of(conversation: Conversation) -> str:
    return Conversation.objects.get(pk=conversation.pk).handoff_state


# --- every transition, from every state -----------------------------------------------------------


def _put_in(conversation: Conversation, state: str, agent: User) -> None:
    """Bring a conversation to `state` the way customers and agents do."""
    if state == State.ASSISTANT:
        return
    if state == State.WAITING:
        waiting(conversation)
        return
    with_agent(conversation, agent)
    if state == State.RESOLVED:
        handoff.handoff_resolve(conversation_id=conversation.pk, agent=agent)


def _act(action: Action, conversation: Conversation, agent: User) -> None:
    if action is Action.REQUEST:
        waiting(conversation)
    elif action is Action.WITHDRAW:
        handoff.handoff_withdraw(conversation=conversation)
    elif action is Action.CLAIM:
        handoff.conversation_claim(conversation_id=conversation.pk, agent=agent)
    elif action is Action.HAND_BACK:
        handoff.handoff_hand_back(conversation_id=conversation.pk, agent=agent)
    elif action is Action.RESOLVE:
        handoff.handoff_resolve(conversation_id=conversation.pk, agent=agent)
    else:
        handoff.conversation_reopen(conversation=conversation)


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("action", list(Action))
def test_each_transition_leaves_only_from_its_states_and_leads_to_its_target(
    action, state, conversation, agent
):
    _put_in(conversation, state, agent)
    sources, target = TRANSITIONS[action]
    if state in sources:
        _act(action, conversation, agent)
        assert state_of(conversation) == target
    elif action is Action.REOPEN:
        _act(action, conversation, agent)  # a customer's message: it goes where the state says
        assert state_of(conversation) == state
    else:
        with pytest.raises(HandoffConflict):
            _act(action, conversation, agent)
        assert state_of(conversation) == state


def test_the_table_names_every_state():
    reached = {target for _, target in TRANSITIONS.values()}
    left = set().union(*(sources for sources, _ in TRANSITIONS.values()))
    assert reached == left == set(State)


# --- the customer -------------------------------------------------------------------------------


def test_asking_for_a_person_records_the_request_and_tells_the_page_once_committed(conversation, publish):
    requested = publish(
        handoff.handoff_request, conversation=conversation, trigger=Handoff.Trigger.BUTTON, tier="vip"
    )
    row = Handoff.objects.get(conversation=conversation)
    assert (row.trigger, row.vip, row.agents_online, row.ended_at) == ("button", True, 0, None)
    assert requested.agents_online == 0
    assert stream_events(conversation) == [("requested", {"trigger": "button", "agents_online": 0})]


def test_the_request_counts_the_agents_online_then(conversation, agent):
    presence_beat(agent_id=agent.pk, tab_id="tab")
    assert waiting(conversation).agents_online == 1


def test_a_new_conversation_is_stored_with_its_request():
    offered = Conversation(session_key="guest-key")
    handoff.handoff_request(conversation=offered, trigger=Handoff.Trigger.BUTTON, tier="normal")
    assert Conversation.objects.get(pk=offered.pk).handoff_state == State.WAITING


@pytest.mark.parametrize(
    "text",
    [
        "Can I talk to a human?",
        "Je voudrais parler à un conseiller",
        "Quiero hablar con una persona",
        "Mensch bitte",
    ],
)
def test_a_message_asking_for_a_person_hands_off_and_is_kept_for_them(text, conversation, publish):
    held = publish(handoff.message_for_person, conversation=conversation, text=text, tier="normal")
    assert held.handoff_state == State.WAITING
    assert held.user_message.content == text
    assert Handoff.objects.get(conversation=conversation).trigger == Handoff.Trigger.WORDS
    assert [kind for kind, _ in stream_events(conversation)] == ["message", "requested"]


def test_a_question_goes_to_the_assistant(conversation):
    assert (
        handoff.message_for_person(conversation=conversation, text="Do gift cards expire?", tier="normal")
        is None
    )
    assert state_of(conversation) == State.ASSISTANT


@pytest.mark.parametrize("state", [State.WAITING, State.AGENT])
def test_a_message_to_a_conversation_with_a_person_is_kept_for_them_with_no_answer(
    state, conversation, agent, publish
):
    _put_in(conversation, state, agent)
    conversation.refresh_from_db()
    held = publish(
        handoff.message_for_person, conversation=conversation, text="Are you there?", tier="normal"
    )
    assert held.handoff_state == state
    assert not conversation.messages.filter(role=Message.Role.ASSISTANT).exists()
    assert stream_events(conversation)[-1][1]["text"] == "Are you there?"


def test_a_message_to_a_resolved_conversation_reopens_it_to_the_assistant(conversation, agent):
    _put_in(conversation, State.RESOLVED, agent)
    conversation.refresh_from_db()
    assert (
        handoff.message_for_person(
            conversation=conversation, text="One more thing: do you ship to Spain?", tier="normal"
        )
        is None
    )
    assert state_of(conversation) == State.ASSISTANT
    # The resolved hand-off stays resolved (and can still be rated).
    assert Handoff.objects.get(conversation=conversation).outcome == Handoff.Outcome.RESOLVED


def test_a_customer_who_stops_waiting_is_back_with_the_assistant(conversation, publish):
    waiting(conversation)
    publish(handoff.handoff_withdraw, conversation=conversation)
    assert Handoff.objects.get(conversation=conversation).outcome == Handoff.Outcome.WITHDRAWN
    assert stream_events(conversation)[-1] == ("handed_back", {"by": "customer"})


def test_a_message_held_while_the_customer_went_back_to_the_assistant_is_refused(conversation):
    waiting(conversation)
    stale = Conversation.objects.get(pk=conversation.pk)
    handoff.handoff_withdraw(conversation=conversation)
    with pytest.raises(HandoffConflict):
        handoff.customer_message_hold(conversation=stale, text="hello?")


# --- the agent ----------------------------------------------------------------------------------


def test_the_first_of_two_claims_wins_and_the_second_is_told_who_has_it(conversation, agent, publish):
    other = make_agent("ana", display_name="Ana")
    waiting(conversation)
    publish(handoff.conversation_claim, conversation_id=conversation.pk, agent=agent)
    with pytest.raises(HandoffConflict, match="Another agent"):
        handoff.conversation_claim(conversation_id=conversation.pk, agent=other)
    row = Handoff.objects.get(conversation=conversation)
    assert row.agent == agent and row.claimed_at is not None
    assert Conversation.objects.get(pk=conversation.pk).assignee == agent
    assert stream_events(conversation)[-1] == ("agent_joined", {"agent": "Sam"})


def test_an_agent_at_capacity_cannot_claim_another(agent):
    AgentProfile.objects.filter(user=agent).update(capacity=1)
    first, second = (Conversation.objects.create(session_key=f"g{n}") for n in range(2))
    with_agent(first, agent)
    waiting(second)
    with pytest.raises(HandoffConflict, match="capacity"):
        handoff.conversation_claim(conversation_id=second.pk, agent=agent)


def test_staff_without_the_agent_permission_cannot_claim(conversation):
    staff = User.objects.create_user("boss", password="pw", is_staff=True)
    waiting(conversation)
    with pytest.raises(NotAnAgent):
        handoff.conversation_claim(conversation_id=conversation.pk, agent=staff)


def test_an_agent_reply_is_stored_under_their_display_name_and_first_reply_is_noted_once(
    conversation, agent, publish
):
    with_agent(conversation, agent)
    first = publish(
        handoff.agent_reply, conversation_id=conversation.pk, agent=agent, text="Hello, I am Sam."
    )
    handoff.agent_reply(conversation_id=conversation.pk, agent=agent, text="How can I help?")
    assert (first.role, first.author_name, first.author) == ("agent", "Sam", agent)
    assert Handoff.objects.get(conversation=conversation).first_reply_at == first.created_at
    kind, data = stream_events(conversation)[-1]
    assert kind == "message" and data["author"] == "Sam" and data["id"] == first.pk


def test_an_agent_without_a_display_name_is_shown_as_the_team_never_by_account_name(conversation):
    nameless = make_agent("jdoe_admin")
    with_agent(conversation, nameless)
    reply = handoff.agent_reply(conversation_id=conversation.pk, agent=nameless, text="Hi")
    assert reply.author_name == handoff.DEFAULT_AGENT_NAME


def test_only_the_agent_who_has_the_conversation_replies(conversation, agent):
    other = make_agent("ana", display_name="Ana")
    with_agent(conversation, agent)
    with pytest.raises(HandoffConflict):
        handoff.agent_reply(conversation_id=conversation.pk, agent=other, text="Me too")


@pytest.mark.parametrize("text", ["", "   ", "x" * 4001])
def test_an_empty_or_over_long_reply_is_refused(text, conversation, agent):
    with_agent(conversation, agent)
    with pytest.raises(HandoffRejected):
        handoff.agent_reply(conversation_id=conversation.pk, agent=agent, text=text)
    assert not conversation.messages.filter(role=Message.Role.AGENT).exists()


def test_a_private_note_is_stored_and_never_reaches_the_customers_stream(conversation, agent, publish):
    with_agent(conversation, agent)
    publish(
        handoff.agent_note,
        conversation_id=conversation.pk,
        agent=agent,
        text="Customer seems upset: refund ok",
    )
    assert AgentNote.objects.get(conversation=conversation).text == "Customer seems upset: refund ok"
    assert not any("refund ok" in json.dumps(data) for _, data in stream_events(conversation))
    assert not conversation.messages.filter(content__contains="refund ok").exists()


def test_hand_back_returns_the_conversation_to_the_assistant(conversation, agent, publish):
    with_agent(conversation, agent)
    publish(handoff.handoff_hand_back, conversation_id=conversation.pk, agent=agent)
    conversation.refresh_from_db()
    assert (conversation.handoff_state, conversation.assignee) == (State.ASSISTANT, None)
    assert Handoff.objects.get(conversation=conversation).outcome == Handoff.Outcome.HANDED_BACK
    assert stream_events(conversation)[-1] == ("handed_back", {"by": "agent"})
    assert (
        handoff.message_for_person(conversation=conversation, text="Where is my order?", tier="normal")
        is None
    )


def test_resolving_asks_the_customer_for_a_rating_which_is_taken_once(conversation, agent, publish):
    with_agent(conversation, agent)
    resolved = publish(handoff.handoff_resolve, conversation_id=conversation.pk, agent=agent)
    assert [kind for kind, _ in stream_events(conversation)][-2:] == ["resolved", "rating_request"]
    rated = handoff.handoff_rate(conversation=conversation, rating=4, comment=" quick, thanks ")
    assert (rated.pk, rated.rating, rated.rating_comment) == (resolved.pk, 4, "quick, thanks")
    with pytest.raises(HandoffConflict):
        handoff.handoff_rate(conversation=conversation, rating=1)
    assert Handoff.objects.get(pk=resolved.pk).rating == 4


@pytest.mark.parametrize("rating", [0, 6, -1])
def test_a_rating_off_the_scale_is_refused(rating, conversation, agent):
    _put_in(conversation, State.RESOLVED, agent)
    with pytest.raises(HandoffRejected):
        handoff.handoff_rate(conversation=conversation, rating=rating)


def test_nothing_to_rate_before_a_person_resolved_it(conversation):
    with pytest.raises(HandoffConflict):
        handoff.handoff_rate(conversation=conversation, rating=5)


def test_asking_again_after_a_resolution_starts_a_new_hand_off(conversation, agent):
    _put_in(conversation, State.RESOLVED, agent)
    waiting(conversation)
    assert conversation.handoffs.count() == 2
    assert conversation.handoffs.filter(ended_at__isnull=True).count() == 1
