"""Canary routing: the split decides per conversation, stickily, from the Redis mirror."""

import time
import uuid

import pytest
from django.test import override_settings

from scheduler import keys, routing
from scheduler.models import CanaryRouting, Experiment, Variant
from scheduler.redis import sync_redis
from scheduler.routing import (
    canary_mirror,
    conversation_bucket,
    experiment_mirror,
    variant_for,
    variant_for_conversation,
)

pytestmark = pytest.mark.django_db

CONVERSATIONS = [str(uuid.uuid4()) for _ in range(2000)]


def _split(percent: int, candidate: str = "candidate", salt: str = "s1") -> None:
    row = CanaryRouting.load()
    row.candidate_variant, row.split_percent, row.salt = candidate, percent, salt
    row.save()
    canary_mirror()


def _candidate_share() -> float:
    return sum(variant_for(conversation_id=c) == "candidate" for c in CONVERSATIONS) / len(CONVERSATIONS)


def test_without_a_canary_every_conversation_goes_to_the_default_variant():
    assert {variant_for(conversation_id=c) for c in CONVERSATIONS[:50]} == {"stable"}


@pytest.mark.parametrize("percent", [0, 5, 30, 100])
def test_the_candidate_gets_its_split_of_conversations(percent):
    _split(percent)
    assert _candidate_share() == pytest.approx(percent / 100, abs=0.03)


def test_a_conversation_keeps_its_variant_and_raising_the_split_only_moves_stable_ones():
    _split(20)
    at_20 = {c: variant_for(conversation_id=c) for c in CONVERSATIONS}
    assert at_20 == {c: variant_for(conversation_id=c) for c in CONVERSATIONS}
    routing._cache.clear()
    _split(50)
    at_50 = {c: variant_for(conversation_id=c) for c in CONVERSATIONS}
    assert all(at_50[c] == "candidate" for c, variant in at_20.items() if variant == "candidate")
    assert sum(at_50[c] != at_20[c] for c in CONVERSATIONS) == pytest.approx(
        0.3 * len(CONVERSATIONS), rel=0.15
    )


def test_each_canary_salt_tries_a_different_share_of_conversations():
    first = {c for c in CONVERSATIONS if conversation_bucket(conversation_id=c, salt="a") < 10}
    second = {c for c in CONVERSATIONS if conversation_bucket(conversation_id=c, salt="b") < 10}
    assert len(first & second) < len(first) / 3


def test_a_lost_mirror_is_rebuilt_from_the_database():
    _split(100)
    sync_redis().delete(keys.CANARY)
    routing._cache.clear()
    assert variant_for(conversation_id=CONVERSATIONS[0]) == "candidate"
    assert sync_redis().hget(keys.CANARY, "split_percent") == "100"


def test_with_redis_unreachable_the_split_is_read_from_the_database():
    _split(100)
    routing._cache.clear()
    sync_redis.cache_clear()
    try:
        with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
            assert variant_for(conversation_id=CONVERSATIONS[0]) == "candidate"
    finally:
        sync_redis.cache_clear()


@pytest.mark.usefixtures("variants")
def test_a_variant_is_read_once_a_second_and_again_at_once_when_it_is_saved(django_assert_num_queries):
    conversation = CONVERSATIONS[0]
    variant_for(conversation_id=conversation)  # the split, mirrored into Redis
    with django_assert_num_queries(1):
        first = variant_for_conversation(conversation_id=conversation)
        assert variant_for_conversation(conversation_id=conversation) is first
    stable = Variant.objects.get(name="stable")
    stable.system_prompt = "Reply in one line."
    stable.save()
    assert variant_for_conversation(conversation_id=conversation).system_prompt == "Reply in one line."
    routing._variants[first.name] = (time.monotonic() - routing.CACHE_S, first)  # a second ago
    with django_assert_num_queries(1):
        variant_for_conversation(conversation_id=conversation)


@pytest.mark.usefixtures("variants")
def test_a_refreshed_process_routes_a_post_without_reading_and_sees_a_change_made_elsewhere(
    django_assert_num_queries,
):
    """What a web process's hot-reads thread does twice a second (config.startup)."""
    conversation = CONVERSATIONS[0]
    routing.routing_refresh()
    # An hour later by the copies' clocks, a post would read the split and its variant again...
    stale = time.monotonic() - 3600
    routing._cache[:] = [(stale, routing._cache[0][1])]
    routing._variants.update({name: (stale, variant) for name, (_, variant) in routing._variants.items()})
    routing.routing_refresh()
    # ...but the refresh read them: the post reads nothing.
    with django_assert_num_queries(0):
        assert variant_for_conversation(conversation_id=conversation).name == "stable"
    # An edit made by another process (no save signal here) is what the next refresh reads.
    Variant.objects.filter(name="stable").update(system_prompt="Reply in one line.")
    routing.routing_refresh()
    with django_assert_num_queries(0):
        assert variant_for_conversation(conversation_id=conversation).system_prompt == "Reply in one line."


def test_during_a_canary_calls_that_need_a_tool_parser_stay_on_stable_when_the_candidate_has_none():
    Variant.objects.filter(name="stable").update(tool_call_parser="pythonic")
    routing.variants_forget()
    _split(100)
    ids = CONVERSATIONS[:20]
    assert {routing.variant_for_request(model="stable", request_id=i).name for i in ids} == {"candidate"}
    needing = {
        routing.variant_for_request(model="stable", request_id=i, needs_tool_parser=True).name for i in ids
    }
    assert needing == {"stable"}
    Variant.objects.filter(name="candidate").update(tool_call_parser="pythonic")
    routing.variants_forget()
    needing = {
        routing.variant_for_request(model="stable", request_id=i, needs_tool_parser=True).name for i in ids
    }
    assert needing == {"candidate"}


# --- A/B experiments beside the canary --------------------------------------------------------

CUSTOMERS = [f"guest:{uuid.uuid4().hex}" for _ in range(1000)]


def _experiment(variant_a: str = "stable", variant_b: str = "candidate", percent: int = 50) -> Experiment:
    experiment = Experiment.objects.create(
        variant_a=variant_a, variant_b=variant_b, split_percent=percent, salt=uuid.uuid4().hex[:8]
    )
    experiment_mirror()
    return experiment


def test_an_experiment_splits_customers_and_each_keeps_its_arm_in_every_conversation():
    _experiment(percent=30)
    arms = {
        customer: {variant_for(conversation_id=c, customer_id=customer) for c in CONVERSATIONS[:5]}
        for customer in CUSTOMERS
    }
    assert all(len(seen) == 1 for seen in arms.values())
    share_a = sum(seen == {"stable"} for seen in arms.values()) / len(CUSTOMERS)
    assert share_a == pytest.approx(0.3, abs=0.05)


def test_the_canary_takes_its_share_of_conversations_first_and_the_arms_share_the_rest():
    Variant.objects.create(
        name="terse", model="m", system_prompt="Be terse.", temperature=0, top_p=1, max_tokens=64
    )
    _split(30, candidate="candidate")
    _experiment(variant_a="stable", variant_b="terse", percent=50)
    routed = [
        variant_for(conversation_id=c, customer_id=CUSTOMERS[n % len(CUSTOMERS)])
        for n, c in enumerate(CONVERSATIONS)
    ]
    shares = {name: routed.count(name) / len(routed) for name in ("candidate", "stable", "terse")}
    assert shares == pytest.approx({"candidate": 0.3, "stable": 0.35, "terse": 0.35}, abs=0.04)
    # The canary's conversations are the ones it took without an experiment.
    for n, conversation in enumerate(CONVERSATIONS[:200]):
        without = variant_for(conversation_id=conversation) == "candidate"
        with_arm = variant_for(conversation_id=conversation, customer_id=CUSTOMERS[n % len(CUSTOMERS)])
        assert (with_arm == "candidate") == without


def test_a_call_with_no_customer_is_in_no_arm():
    _experiment(variant_a="candidate", variant_b="stable", percent=99)
    assert {variant_for(conversation_id=c) for c in CONVERSATIONS[:100]} == {"stable"}


def test_an_ended_experiment_routes_every_customer_to_stable_again():
    experiment = _experiment(variant_a="candidate", variant_b="stable", percent=99)
    assert "candidate" in {
        variant_for(conversation_id=CONVERSATIONS[0], customer_id=c) for c in CUSTOMERS[:100]
    }
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.ENDED)
    experiment_mirror()
    assert {variant_for(conversation_id=CONVERSATIONS[0], customer_id=c) for c in CUSTOMERS[:100]} == {
        "stable"
    }


def test_a_lost_experiment_mirror_is_rebuilt_and_without_redis_it_is_read_from_the_database():
    _experiment(variant_a="candidate", variant_b="stable", percent=99)
    sync_redis().delete(keys.EXPERIMENT)
    routing._experiment_cache.clear()
    arm = variant_for(conversation_id=CONVERSATIONS[0], customer_id=CUSTOMERS[0])
    assert sync_redis().hget(keys.EXPERIMENT, "variant_a") == "candidate"
    routing._experiment_cache.clear()
    sync_redis.cache_clear()
    try:
        with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
            routing._cache.clear()
            assert variant_for(conversation_id=CONVERSATIONS[0], customer_id=CUSTOMERS[0]) == arm
    finally:
        sync_redis.cache_clear()


@pytest.mark.usefixtures("variants")
def test_a_refreshed_process_routes_a_customer_to_an_arm_without_reading(django_assert_num_queries):
    Variant.objects.create(
        name="terse", model="m", system_prompt="Be terse.", temperature=0, top_p=1, max_tokens=64
    )
    _experiment(variant_a="terse", variant_b="stable", percent=99)
    routing.routing_refresh()
    customers = [c for c in CUSTOMERS if routing.experiment_split().arm_of(c) == "terse"]
    with django_assert_num_queries(0):
        assert (
            variant_for_conversation(conversation_id=CONVERSATIONS[0], customer_id=customers[0]).name
            == "terse"
        )
