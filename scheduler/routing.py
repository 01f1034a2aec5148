"""Which model variant answers a conversation: the stable one, the canary candidate for the
console's share of conversations, or, while an A/B experiment runs, the customer's arm.

Sticky without storage: a conversation's bucket is a hash of its id (salted per canary) into
0..99, and it goes to the candidate while its bucket is below the split. Raising the split
only moves conversations from stable to candidate; a rollback (split 0) moves every one back.
An experiment buckets customers the same way (their account, or a guest's client id, salted per
experiment), so a customer meets the same arm in every conversation. The canary decides first:
the conversations it takes stay the candidate's whatever the experiment; those it leaves to
stable go to the customer's arm (a canary judges a release on a share of all traffic, an
experiment compares outcomes among what is left). API calls belong to no customer's arm.
The split and the experiment live in the database (CanaryRouting, Experiment), mirrored into
Redis, and each process reads the mirrors at most once a second, so a change applies everywhere
within a second. The variants themselves are read from the database at most once a second too.
A web process reads them all again twice a second in a thread of its own (`routing_refresh`,
config.startup), so that a post never waits for them.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import redis
from django.db import transaction

from scheduler import keys
from scheduler.models import CanaryRouting, Experiment, Variant
from scheduler.redis import sync_redis

CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class CanarySplit:
    stable_variant: str
    candidate_variant: str
    split_percent: int
    salt: str

    @classmethod
    def from_routing(cls, routing: CanaryRouting) -> CanarySplit:
        return cls(routing.stable_variant, routing.candidate_variant, routing.split_percent, routing.salt)


_cache: list[tuple[float, CanarySplit]] = []


def canary_mirror() -> CanarySplit:
    """Write the split from the database into Redis; returns it."""
    split = CanarySplit.from_routing(CanaryRouting.load())
    sync_redis().hset(
        keys.CANARY,
        mapping={
            "stable_variant": split.stable_variant,
            "candidate_variant": split.candidate_variant,
            "split_percent": str(split.split_percent),
            "salt": split.salt,
        },
    )
    _cache.clear()
    return split


def canary_split(*, max_age_s: float = CACHE_S) -> CanarySplit:
    """The split as routing applies it: from the mirror, rebuilt from the database when Redis
    lost it, read from the database while Redis is unreachable (admission then refuses anyway,
    with its own clear outcome). Read again when the process's copy is `max_age_s` old."""
    if _cache and time.monotonic() - _cache[0][0] < max_age_s:
        return _cache[0][1]
    try:
        values = sync_redis().hgetall(keys.CANARY)
        if values:
            split = CanarySplit(
                stable_variant=values["stable_variant"],
                candidate_variant=values["candidate_variant"],
                split_percent=int(values["split_percent"]),
                salt=values["salt"],
            )
        else:
            split = canary_mirror()
    except (redis.ConnectionError, redis.TimeoutError):
        split = CanarySplit.from_routing(CanaryRouting.load())
    _cache[:] = [(time.monotonic(), split)]
    return split


def _bucket(key: str, salt: str) -> int:
    digest = hashlib.blake2b(f"{salt}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 100


def conversation_bucket(*, conversation_id: str, salt: str) -> int:
    """0..99, the same for a conversation for as long as the canary's salt stays."""
    return _bucket(conversation_id, salt)


def customer_bucket(*, customer_id: str, salt: str) -> int:
    """0..99, the same for a customer for as long as the experiment's salt stays."""
    return _bucket(customer_id, salt)


@dataclass(frozen=True, slots=True)
class ExperimentSplit:
    """The running experiment as routing applies it."""

    experiment_id: int
    variant_a: str
    variant_b: str
    split_percent: int  # customers on variant_a
    salt: str

    @classmethod
    def from_experiment(cls, experiment: Experiment) -> ExperimentSplit:
        return cls(
            experiment.pk,
            experiment.variant_a,
            experiment.variant_b,
            experiment.split_percent,
            experiment.salt,
        )

    @property
    def arms(self) -> tuple[str, str]:
        return self.variant_a, self.variant_b

    def arm_of(self, customer_id: str) -> str:
        """The variant that answers this customer while the experiment runs."""
        bucket = customer_bucket(customer_id=customer_id, salt=self.salt)
        return self.variant_a if bucket < self.split_percent else self.variant_b


_experiment_cache: list[tuple[float, ExperimentSplit | None]] = []


def _experiment_running() -> ExperimentSplit | None:
    running = Experiment.objects.filter(status=Experiment.Status.RUNNING).first()
    return None if running is None else ExperimentSplit.from_experiment(running)


def experiment_mirror() -> ExperimentSplit | None:
    """Write the running experiment (or that none runs) from the database into Redis."""
    split = _experiment_running()
    if split is None:
        mapping = {"id": ""}
    else:
        mapping = {
            "id": str(split.experiment_id),
            "variant_a": split.variant_a,
            "variant_b": split.variant_b,
            "split_percent": str(split.split_percent),
            "salt": split.salt,
        }
    client = sync_redis()
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(keys.EXPERIMENT)
        pipe.hset(keys.EXPERIMENT, mapping=mapping)
        pipe.execute()
    _experiment_cache.clear()
    return split


def experiment_split(*, max_age_s: float = CACHE_S) -> ExperimentSplit | None:
    """The running experiment, read like the canary split: from the mirror (rebuilt from the
    database when Redis lost it), from the database while Redis is unreachable."""
    if _experiment_cache and time.monotonic() - _experiment_cache[0][0] < max_age_s:
        return _experiment_cache[0][1]
    try:
        values = sync_redis().hgetall(keys.EXPERIMENT)
        if not values:
            split = experiment_mirror()
        elif not values.get("id"):
            split = None
        else:
            split = ExperimentSplit(
                experiment_id=int(values["id"]),
                variant_a=values["variant_a"],
                variant_b=values["variant_b"],
                split_percent=int(values["split_percent"]),
                salt=values["salt"],
            )
    except (redis.ConnectionError, redis.TimeoutError):
        split = _experiment_running()
    _experiment_cache[:] = [(time.monotonic(), split)]
    return split


def variant_for(*, conversation_id: str, customer_id: str | None = None) -> str:
    """The canary's candidate for its share of conversations; for the others, the customer's
    arm while an experiment runs (when the customer is known), else stable."""
    split = canary_split()
    if split.candidate_variant:
        bucket = conversation_bucket(conversation_id=conversation_id, salt=split.salt)
        if bucket < split.split_percent:
            return split.candidate_variant
    if customer_id:
        experiment = experiment_split()
        if experiment is not None:
            return experiment.arm_of(customer_id)
    return split.stable_variant


# Variants by name, each read from the database at most once a CACHE_S, like the split: an edit
# (the console's) applies everywhere within a second, and at once in the process that saved it.
_variants: dict[str, tuple[float, Variant]] = {}


def _variant_named(name: str, *, max_age_s: float = CACHE_S) -> Variant | None:
    """The variant as stored at most `max_age_s` ago (the console may edit it), or None."""
    if "\x00" in name:
        return None  # no variant's name has one, and PostgreSQL refuses a NUL in a query
    cached = _variants.get(name)
    if cached is not None and time.monotonic() - cached[0] < max_age_s:
        return cached[1]
    variant = Variant.objects.filter(name=name).first()
    if variant is None:
        _variants.pop(name, None)
    else:
        _variants[name] = (time.monotonic(), variant)
    return variant


def routing_refresh() -> None:
    """Read the split and the variants this process routes to again, whatever their age: a web
    process does it twice a second (config.startup.hot_reads_keep_fresh), so that its posts find
    them less than a second old and read neither."""
    split = canary_split(max_age_s=0)
    experiment = experiment_split(max_age_s=0)
    arms = experiment.arms if experiment is not None else ()
    for name in {split.stable_variant, split.candidate_variant, *arms, *_variants} - {""}:
        _variant_named(name, max_age_s=0)


def variant_for_conversation(*, conversation_id: str, customer_id: str | None = None) -> Variant:
    """The variant that answers the conversation (of `customer_id`, a client id: see
    variant_for), as stored at most a second ago (the console may edit it)."""
    name = variant_for(conversation_id=conversation_id, customer_id=customer_id)
    variant = _variant_named(name)
    if variant is None:
        raise Variant.DoesNotExist(f"The routed variant {name!r} does not exist.")
    return variant


def variant_for_request(*, model: str, request_id: str, needs_tool_parser: bool = False) -> Variant | None:
    """The variant that answers an API request naming `model`: the stable variant's name is
    routed as a conversation is (the canary takes its share, by `request_id`), another variant's
    name is that variant (a caller trying the candidate), anything else None (vLLM's 404).
    A call that needs its variant's tool-call parser (`tool_choice: "auto"`) is not routed to a
    candidate without one: it stays on stable, rather than a share of such calls failing."""
    if model == canary_split().stable_variant:
        routed = variant_for_conversation(conversation_id=request_id)
        if needs_tool_parser and routed is not None and not routed.tool_call_parser:
            return _variant_named(model)
        return routed
    return _variant_named(model)


def variants_forget(**kwargs: object) -> None:
    """Read every variant from the database again (a receiver of Variant's saves and deletes):
    now, and once the change commits, in case a read in between found the row before it."""
    _variants.clear()
    transaction.on_commit(_variants.clear)


def variant_models(names: list[str]) -> set[str]:
    """The models that answer these variants (the queues and workers traffic to them needs)."""
    return set(Variant.objects.filter(name__in=names).values_list("model", flat=True))
