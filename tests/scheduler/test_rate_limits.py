import pytest

from scheduler import keys
from scheduler.rate_limits import Bucket, RateCharge, rate_limit_take
from scheduler.redis import sync_redis


def _bucket(name: str, capacity: float, refill: float) -> Bucket:
    return Bucket(keys.bucket_user(name), name, capacity, refill)


def _take(buckets, client="c", max_inflight=100, request_id=None):
    _take.n = getattr(_take, "n", 0) + 1
    return rate_limit_take(
        RateCharge(
            buckets=tuple(buckets),
            inflight_key=keys.inflight(client),
            max_inflight=max_inflight,
            request_id=request_id or f"r{_take.n}",
            lapse_s=60,
        )
    )


def test_a_bucket_admits_its_capacity_then_refuses_with_its_refill_time():
    bucket = _bucket("alice", capacity=3, refill=0.01)
    assert [_take([bucket]).allowed for _ in range(3)] == [True, True, True]
    refused = _take([bucket])
    assert not refused.allowed
    assert refused.limited_by == "alice"
    # Empty bucket, 0.01 tokens/s: the next token is about 100 s away (a slow refill, so that a
    # test stalled by a busy machine refills too little to move it).
    assert refused.retry_after_s == pytest.approx(100.0, rel=0.02)


def test_a_refusal_charges_no_bucket():
    roomy = _bucket("roomy", capacity=10, refill=0.01)
    empty = _bucket("empty", capacity=1, refill=0.01)
    assert _take([roomy, empty]).allowed
    for _ in range(5):
        decision = _take([roomy, empty])
        assert not decision.allowed and decision.limited_by == "empty"
    # roomy lost only the one token of the admitted request
    assert sum(_take([roomy]).allowed for _ in range(20)) == 9


def test_clients_have_separate_buckets():
    for _ in range(2):
        assert _take([_bucket("a", 2, 0.01)]).allowed
    assert not _take([_bucket("a", 2, 0.01)]).allowed
    assert _take([_bucket("b", 2, 0.01)]).allowed


def test_a_client_may_have_only_so_many_unfinished_requests():
    roomy = _bucket("roomy", capacity=100, refill=1)
    assert _take([roomy], max_inflight=2, request_id="one").allowed
    assert _take([roomy], max_inflight=2, request_id="two").allowed
    refused = _take([roomy], max_inflight=2, request_id="three")
    assert (refused.allowed, refused.limited_by) == (False, "concurrency")
    sync_redis().zrem(keys.inflight("c"), "one")  # what the worker does when "one" finishes
    assert _take([roomy], max_inflight=2, request_id="three").allowed


def test_a_bucket_charges_its_own_cost_and_reports_every_level():
    requests = _bucket("requests", capacity=2, refill=0.001)
    tokens = Bucket(keys.bucket_user("tokens"), "tokens", 100, 0.001, cost=30)
    first = _take([requests, tokens])
    assert first.allowed
    assert first.levels == pytest.approx((1, 70), abs=0.01)
    assert _take([requests, tokens]).levels == pytest.approx((0, 40), abs=0.01)
    refused = _take([requests, tokens])
    assert (refused.allowed, refused.limited_by) == (False, "requests")
    assert refused.levels == pytest.approx((0, 40), abs=0.01)  # read, not charged
    expensive = Bucket(keys.bucket_user("tokens"), "tokens", 100, 0.001, cost=50)
    assert _take([expensive]).limited_by == "tokens"
