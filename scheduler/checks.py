"""System checks for the scheduler's settings: worker liveness, job leases and tier policies.

`manage.py check` runs them, and so does every process when it starts (config/startup.py);
an error stops it there, instead of traffic that waits for ever.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError

from scheduler.generation import Tier
from scheduler.rules import Problem, lease_renewal_s, tier_policy_problems


def _message(problem: Problem, obj: str) -> CheckMessage:
    kind = Error if problem.level == "error" else Warning
    return kind(problem.message, hint=problem.hint, obj=obj, id=problem.id)


@register()
def worker_liveness_check(**kwargs: Any) -> list[CheckMessage]:
    interval_s, ttl_s = settings.WORKER_HEARTBEAT_S, settings.WORKER_HEARTBEAT_TTL_S
    if ttl_s <= interval_s:
        return [
            Error(
                f"Worker heartbeats expire after WORKER_HEARTBEAT_TTL_S = {ttl_s:g} s but are "
                f"written every WORKER_HEARTBEAT_S = {interval_s:g} s: live workers look dead "
                "between heartbeats, so /readyz fails and admission finds no capacity.",
                hint="Set WORKER_HEARTBEAT_TTL_S to several times WORKER_HEARTBEAT_S (defaults: 5 and 1).",
                id="scheduler.E001",
            )
        ]
    if ttl_s < 2 * interval_s:
        return [
            Warning(
                f"WORKER_HEARTBEAT_TTL_S = {ttl_s:g} s is less than two heartbeats "
                f"(WORKER_HEARTBEAT_S = {interval_s:g} s): one late heartbeat makes a live "
                "worker look dead.",
                hint="Set WORKER_HEARTBEAT_TTL_S to several times WORKER_HEARTBEAT_S (defaults: 5 and 1).",
                id="scheduler.W001",
            )
        ]
    return []


@register()
def job_lease_check(**kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    lease_s = settings.JOB_LEASE_S
    if lease_s <= lease_renewal_s(lease_s):
        messages.append(
            Error(
                f"JOB_LEASE_S = {lease_s:g} s runs out before a worker renews it (every "
                f"{lease_renewal_s(lease_s):g} s): other workers take over jobs that are still "
                "being answered, and every answer restarts.",
                hint="Set JOB_LEASE_S to a few seconds or more (default 15).",
                id="scheduler.E002",
            )
        )
    if settings.JOB_MAX_ATTEMPTS < 1:
        messages.append(
            Error(
                f"JOB_MAX_ATTEMPTS = {settings.JOB_MAX_ATTEMPTS}: a job taken over from a dead "
                "worker is dead-lettered without being run.",
                hint="Set JOB_MAX_ATTEMPTS to 1 or more (default 3).",
                id="scheduler.E003",
            )
        )
    return messages


@register()
def tier_policy_settings_check(**kwargs: Any) -> list[CheckMessage]:
    """The policies a new database is given, as the environment gives them: one per tier."""
    named, tiers = set(settings.RATE_LIMIT_POLICIES), {str(tier) for tier in Tier}
    if named != tiers:
        return [
            Error(
                f"RATE_LIMIT_POLICIES names the tiers {sorted(named)}; the scheduler's tiers are "
                f"{sorted(tiers)}: a tier without a policy cannot be admitted, and a policy "
                "without a tier is never used.",
                hint="Give RATE_LIMIT_POLICIES one entry for each of the tiers of scheduler.generation.Tier.",
                id="scheduler.E005",
            )
        ]
    return [
        _message(problem, f"RATE_LIMIT_POLICIES[{tier!r}]")
        for tier, values in settings.RATE_LIMIT_POLICIES.items()
        for problem in tier_policy_problems(
            tier=tier, wait_slo_s=values["wait_slo_s"], max_wait_s=values["max_wait_s"]
        )
    ]


@register(Tags.database)
def tier_policy_stored_check(*, databases: Iterable[str] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """The policies in force (edited in the console), against today's settings: a policy saved
    under other settings may no longer fit."""
    if not databases or "default" not in databases:
        return []
    from scheduler.models import TierPolicy

    try:
        rows = list(TierPolicy.objects.values("tier", "wait_slo_s", "max_wait_s"))
    except DatabaseError:
        return []  # not migrated yet: the settings check covers what the migration will write
    return [
        _message(problem, f"tier policy {row['tier']!r} (console)")
        for row in rows
        for problem in tier_policy_problems(**row)
    ]


@register()
def autoscale_check(**kwargs: Any) -> list[CheckMessage]:
    utilization = settings.AUTOSCALE_TARGET_UTILIZATION
    if not 0 < utilization <= 1:
        return [
            Error(
                f"AUTOSCALE_TARGET_UTILIZATION = {utilization:g}: the workers asked for "
                "(llm_workers_desired) would be busy more than all of the time, or never.",
                hint="Set AUTOSCALE_TARGET_UTILIZATION above 0 and at most 1 (default 0.8).",
                id="scheduler.E004",
            )
        ]
    return []


@register()
def redis_sentinel_check(**kwargs: Any) -> list[CheckMessage]:
    scheme = settings.REDIS_URL.partition("://")[0]
    if settings.REDIS_SENTINELS and scheme != "redis":
        return [
            Error(
                f"REDIS_URL asks for {scheme}:// but REDIS_SENTINELS is set: connections to the "
                "primary the Sentinels name are plain TCP, so TLS (or the socket) would be "
                "dropped without a word, and the password with it sent in the clear.",
                hint="With Sentinels, give REDIS_URL as redis://[[user]:password@]host/db; "
                "reach Redis over a private network, or run it without Sentinels.",
                id="scheduler.E006",
            )
        ]
    return []


@register(deploy=True)
def redis_login_check(**kwargs: Any) -> list[CheckMessage]:
    """Whoever reaches Redis reads every answer as it streams and can feed the queues, the rate
    limits and the console's live snapshots."""
    if settings.REDIS_LOGIN.get("password"):
        return []
    return [
        Warning(
            "REDIS_URL has no password: anyone who reaches Redis reads every answer stream and can "
            "write to the queues, the rate limits and the sign-in throttle.",
            hint="Give Redis an ACL user with a password (docs/DEPLOY.md) and put its login in "
            "REDIS_URL: redis://chat:<password>@host:6379/0, or rediss:// over TLS.",
            id="scheduler.W002",
        )
    ]
