"""What conversations came to (chat.outcomes): resolved by the assistant or not, per variant and
per arm of an experiment, and the intervals the console shows."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import User
from chat import handoff
from chat.guests import guest_client_id
from chat.models import Conversation, Handoff, Message
from chat.outcomes import (
    conversation_outcomes,
    experiment_results,
    outcomes_by_variant,
    t_interval,
    wilson,
)
from scheduler.models import Experiment
from scheduler.routing import ExperimentSplit
from tests.chat.conftest import make_agent
from tests.generation_jobs import generation_record

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def _conversation(
    *,
    owner: User | None = None,
    guest: str = "",
    variant: str = "stable",
    ago: timedelta = 2 * DAY,
    down: bool = False,
) -> Conversation:
    """A conversation of one question and its answer, its last message `ago`."""
    conversation = Conversation.objects.create(
        owner=owner, session_key="" if owner else guest or uuid.uuid4().hex
    )
    question = Message.objects.create(
        conversation=conversation, role=Message.Role.USER, content="Do gift cards expire?"
    )
    answer = Message.objects.create(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        generation=generation_record(variant=variant, status="done", text="Never."),
        feedback=Message.Feedback.DOWN if down else None,
    )
    moment = timezone.now() - ago
    Conversation.objects.filter(pk=conversation.pk).update(created_at=moment)
    Message.objects.filter(pk__in=[question.pk, answer.pk]).update(created_at=moment)
    return conversation


def _verdict(conversation: Conversation) -> bool | None:
    outcome = next(
        o
        for o in conversation_outcomes(since=timezone.now() - 30 * DAY)
        if o.conversation_id == str(conversation.pk)
    )
    return outcome.resolved_by_assistant(now=timezone.now(), window=DAY)


def test_a_conversation_that_ended_a_day_ago_with_nothing_after_it_was_resolved_by_the_assistant():
    assert _verdict(_conversation()) is True


def test_it_is_undecided_until_the_day_is_over():
    assert _verdict(_conversation(ago=timedelta(hours=3))) is None


def test_a_thumbs_down_a_hand_off_or_the_customer_coming_back_means_it_was_not():
    down = _conversation(down=True, ago=timedelta(hours=1))
    handed = _conversation(ago=timedelta(hours=1))
    handoff.handoff_request(conversation=handed, trigger=Handoff.Trigger.BUTTON, tier="normal")
    alice = User.objects.create_user("alice", password="pw")
    first = _conversation(owner=alice, ago=5 * DAY)
    _conversation(owner=alice, ago=5 * DAY - timedelta(hours=2))  # back two hours later
    late = _conversation(owner=alice, ago=2 * DAY)  # back three days later: not about the first
    assert (_verdict(down), _verdict(handed), _verdict(first)) == (False, False, False)
    assert _verdict(late) is True


def test_per_variant_each_conversation_counts_for_its_first_answers_variant_with_hand_off_measures():
    sam = make_agent("sam", display_name="Sam")
    for _ in range(3):
        _conversation(variant="stable")
    handed = _conversation(variant="candidate")
    _conversation(variant="candidate")
    requested = handoff.handoff_request(
        conversation=handed, trigger=Handoff.Trigger.BUTTON, tier="normal"
    ).handoff
    Handoff.objects.filter(pk=requested.pk).update(requested_at=timezone.now() - timedelta(seconds=100))
    handoff.conversation_claim(conversation_id=handed.pk, agent=sam)
    handoff.agent_reply(conversation_id=handed.pk, agent=sam, text="Hello")
    handoff.handoff_resolve(conversation_id=handed.pk, agent=sam)
    handoff.handoff_rate(conversation=handed, rating=4)
    rows = {row.label: row for row in outcomes_by_variant()}
    assert (rows["stable"].conversations, rows["candidate"].conversations) == (3, 2)
    assert rows["candidate"].handoff_rate.value == 0.5
    assert rows["stable"].resolved_by_assistant.value == 1.0
    assert rows["candidate"].first_reply_p50_s == pytest.approx(100, abs=5)
    assert rows["candidate"].resolution_p90_s == pytest.approx(100, abs=5)
    assert rows["candidate"].rating.value == 4


def test_wilson_interval_of_a_rate():
    interval = wilson(30, 100)
    assert (interval.low, interval.high) == (pytest.approx(0.2189, abs=1e-4), pytest.approx(0.3958, abs=1e-4))
    assert interval.enough
    assert not wilson(3, 10).enough  # a rate over fewer than 30 means nothing yet
    assert wilson(0, 0).value is None


def test_t_interval_of_a_mean():
    interval = t_interval([4, 5, 3, 4, 5, 4, 2, 5, 4, 4])
    assert interval.value == 4.0
    # mean ± t(0.975, 9) · s / √n, s = 0.9428
    assert (interval.low, interval.high) == (pytest.approx(3.3256, abs=1e-3), pytest.approx(4.6744, abs=1e-3))
    assert interval.enough
    assert not t_interval([5, 4]).enough


def test_an_arm_is_better_only_once_the_intervals_are_shown_and_apart():
    assert wilson(80, 100).above(wilson(40, 100))
    assert not wilson(50, 100).above(wilson(45, 100))
    assert not wilson(9, 10).above(wilson(1, 10))  # apart, but too few to say


def test_an_experiment_counts_each_arms_customers_and_picks_the_arm_that_resolves_more():
    experiment = Experiment.objects.create(
        variant_a="stable", variant_b="candidate", split_percent=50, salt="s", started_at=timezone.now()
    )
    Experiment.objects.filter(pk=experiment.pk).update(started_at=timezone.now() - 10 * DAY)
    experiment.refresh_from_db()
    split = ExperimentSplit.from_experiment(experiment)
    guests = {"stable": [], "candidate": []}
    while min(len(g) for g in guests.values()) < 40:
        key = uuid.uuid4().hex
        guests[split.arm_of(guest_client_id(key))].append(key)
    for n, key in enumerate(guests["stable"][:40]):
        _conversation(guest=key, variant="stable", down=n < 4)  # 36 of 40 resolved
    for n, key in enumerate(guests["candidate"][:40]):
        _conversation(guest=key, variant="candidate", down=n < 24)  # 16 of 40
    # A conversation the canary answered for a stable-arm customer is neither arm's.
    _conversation(guest=guests["stable"][0], variant="canary-candidate", ago=3 * DAY)
    results = experiment_results(experiment=experiment)
    stable, candidate = results.arms
    assert (stable.conversations, candidate.conversations) == (40, 40)
    assert (stable.resolved_by_assistant.value, candidate.resolved_by_assistant.value) == (0.9, 0.4)
    assert results.better == "stable"
