import pytest

from scheduler import keys
from scheduler.rate_limits import Bucket, buckets_take


def _bucket(name: str, capacity: float, refill: float) -> Bucket:
    return Bucket(keys.bucket_user(name), name, capacity, refill)


def test_a_bucket_admits_its_capacity_then_refuses_with_its_refill_time():
    bucket = _bucket("alice", capacity=3, refill=0.5)
    assert [buckets_take([bucket]).allowed for _ in range(3)] == [True, True, True]
    refused = buckets_take([bucket])
    assert not refused.allowed
    assert refused.limited_by == "alice"
    # Empty bucket, 0.5 tokens/s: the next token is about 2 s away.
    assert refused.retry_after_s == pytest.approx(2.0, abs=0.1)


def test_a_refusal_charges_no_bucket():
    roomy = _bucket("roomy", capacity=10, refill=1)
    empty = _bucket("empty", capacity=1, refill=0.01)
    assert buckets_take([roomy, empty]).allowed
    for _ in range(5):
        decision = buckets_take([roomy, empty])
        assert not decision.allowed and decision.limited_by == "empty"
    # roomy lost only the one token of the admitted request
    assert sum(buckets_take([roomy]).allowed for _ in range(20)) == 9


def test_clients_have_separate_buckets():
    for _ in range(2):
        assert buckets_take([_bucket("a", 2, 0.01)]).allowed
    assert not buckets_take([_bucket("a", 2, 0.01)]).allowed
    assert buckets_take([_bucket("b", 2, 0.01)]).allowed
