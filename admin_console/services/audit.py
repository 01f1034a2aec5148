"""The shared part of the console's writes: the audit log entry every change makes, and the
error a change refused in the current state raises.

Every change lands in the audit log (who, when, before, after) and reaches the scheduler's
Redis mirror right after it commits, so it applies within a second without a restart.
"""

from __future__ import annotations

from typing import Any

from accounts.models import User
from admin_console.models import AuditLog

# Who the audit log names for changes the canary's evaluation makes on its own.
EVALUATION_ACTOR_NAME = "canary evaluation"


class ConsoleError(ValueError):
    """A change that cannot be made in the current state; the message says why."""


def _audit(
    *,
    actor: User | None,
    action: AuditLog.Action,
    target: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    unattended_by: str = EVALUATION_ACTOR_NAME,
) -> AuditLog:
    """`unattended_by` names who made a change without an account (`actor` None)."""
    return AuditLog.objects.create(
        actor=actor,
        actor_name=actor.get_username() if actor is not None else unattended_by,
        action=action,
        target=target,
        before=before,
        after=after,
    )
