"""What the scheduler's settings and tier policies must satisfy to work.

One place for each rule: the system checks (`scheduler/checks.py`) report them at start, and
the console's policy editor refuses a policy that breaks one, in the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from django.conf import settings

from scheduler.generation import Tier

# An API caller waits for the queue and the generation, plus this long for the worker's verdict.
ANSWER_WAIT_MARGIN_S = 10.0
# A worker renews its jobs' leases this often, but never more than five times a second.
LEASE_RENEWAL_MIN_S = 0.2


@dataclass(frozen=True, slots=True)
class Problem:
    """A setting or policy that cannot work (error) or may fail under load (warning)."""

    level: Literal["error", "warning"]
    id: str  # as `manage.py check` shows it, e.g. "scheduler.E101"
    field: str  # the policy field (or setting) to change
    message: str
    hint: str


def answer_wait_limit_s(max_wait_s: float) -> float:
    """The longest an API caller waits for a whole answer: its queue wait, the generation, and
    the margin for the worker to say it gave up."""
    return max_wait_s + settings.GENERATION_TIMEOUT_S + ANSWER_WAIT_MARGIN_S


def lease_renewal_s(lease_s: float) -> float:
    """How often a worker renews the leases of its running jobs."""
    return max(LEASE_RENEWAL_MIN_S, lease_s / 3)


def tier_policy_problems(*, tier: str, wait_slo_s: float, max_wait_s: float) -> list[Problem]:
    problems = []
    if wait_slo_s > max_wait_s:
        problems.append(
            Problem(
                "error",
                "scheduler.E101",
                "wait_slo_s",
                f"The {tier} tier admits a predicted wait of {wait_slo_s:g} s, but its queued "
                f"requests expire after {max_wait_s:g} s: requests admitted near the limit are "
                "bound to expire.",
                "Set the longest predicted wait admitted (wait_slo_s) at or below the expiry (max_wait_s).",
            )
        )
    if tier == Tier.NORMAL and settings.SCHEDULER_PRIORITY and max_wait_s <= settings.NORMAL_AGING_S:
        problems.append(
            Problem(
                "warning",
                "scheduler.W101",
                "max_wait_s",
                f"Normal requests expire after {max_wait_s:g} s, before they age past VIP traffic "
                f"(NORMAL_AGING_S = {settings.NORMAL_AGING_S:g} s): under steady VIP load they "
                "expire instead of going first.",
                "Raise the normal tier's expiry (max_wait_s) above NORMAL_AGING_S, or lower NORMAL_AGING_S.",
            )
        )
    proxy_s = settings.PROXY_READ_TIMEOUT_S
    if tier != Tier.BATCH and proxy_s > 0 and answer_wait_limit_s(max_wait_s) > proxy_s:
        problems.append(
            Problem(
                "warning",
                "scheduler.W102",
                "max_wait_s",
                f"A non-streamed API answer in the {tier} tier may take "
                f"{answer_wait_limit_s(max_wait_s):g} s (expiry {max_wait_s:g} s + "
                f"GENERATION_TIMEOUT_S {settings.GENERATION_TIMEOUT_S:g} s + "
                f"{ANSWER_WAIT_MARGIN_S:g} s), longer than the proxy waits "
                f"(PROXY_READ_TIMEOUT_S = {proxy_s:g} s): the caller gets a gateway timeout "
                "while the answer is still being written.",
                "Lower the tier's expiry (max_wait_s) or GENERATION_TIMEOUT_S, or raise the "
                "proxy's read timeout and PROXY_READ_TIMEOUT_S with it.",
            )
        )
    return problems
