"""System checks for the settings of batch jobs.

`manage.py check` runs them, and so does every process when it starts (config/startup.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

from api.jobs import READ_BLOCK_S


@register()
def batch_job_lease_check(**kwargs: Any) -> list[CheckMessage]:
    # A task renews its job's lease every third of the lease, between reads that block up to
    # READ_BLOCK_S: the lease must outlast one renewal period plus one read.
    lease_s = settings.BATCH_JOB_LEASE_S
    if lease_s / 3 + READ_BLOCK_S >= lease_s:
        return [
            Error(
                f"BATCH_JOB_LEASE_S = {lease_s:g} s runs out before the task feeding a job can "
                "renew it: a second task takes the job over while the first still feeds it.",
                hint=f"Set BATCH_JOB_LEASE_S above {1.5 * READ_BLOCK_S:g} s (default 30).",
                id="api.E001",
            )
        ]
    return []
