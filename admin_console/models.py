"""What the console keeps: an audit log of every change staff (or the canary) made, and one
row per canary release with its step plan, rollback rules and outcome.

The split itself lives in scheduler.models.CanaryRouting, which routing reads.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models


class AuditLog(models.Model):
    class Action(models.TextChoices):
        POLICY_UPDATE = "policy.update", "Rate-limit policy changed"
        VARIANT_CREATE = "variant.create", "Model variant added"
        VARIANT_UPDATE = "variant.update", "Model variant changed"
        ANSWER_PIN = "answer.pin", "Answer pinned"
        ANSWER_UNPIN = "answer.unpin", "Pinned answer removed"
        CANARY_START = "canary.start", "Canary started"
        CANARY_SPLIT = "canary.split", "Canary split changed"
        CANARY_PROMOTE = "canary.promote", "Canary promoted"
        CANARY_ROLLBACK = "canary.rollback", "Canary rolled back"
        WORKER_DRAIN = "worker.drain", "Worker drain requested"
        WARM_SPARES = "worker.spares", "Warm spares changed"
        API_KEY_CREATE = "api_key.create", "API key issued"
        API_KEY_REVOKE = "api_key.revoke", "API key revoked"
        API_KEY_LIMITS = "api_key.limits", "API key limits changed"
        ARTICLE_CREATE = "article.create", "Help article created"
        ARTICLE_UPDATE = "article.update", "Help article edited"
        ARTICLE_RETIRE = "article.retire", "Help article retired"
        ARTICLE_RESTORE = "article.restore", "Help article restored"
        HANDOFF_CLAIM = "handoff.claim", "Conversation claimed by an agent"
        HANDOFF_REPLY = "handoff.reply", "Agent replied to a customer"
        HANDOFF_NOTE = "handoff.note", "Agent left a private note"
        HANDOFF_HAND_BACK = "handoff.hand_back", "Conversation handed back to the assistant"
        HANDOFF_RESOLVE = "handoff.resolve", "Conversation resolved by an agent"
        AGENT_PROFILE = "agent.profile", "Agent profile changed"
        HANDOFF_TARGET = "handoff.target", "First-response target changed"
        EXPERIMENT_START = "experiment.start", "A/B experiment started"
        EXPERIMENT_END = "experiment.end", "A/B experiment ended"

    # Automatic changes (the canary's evaluation) have no actor; the name survives the account.
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=32, choices=Action.choices)
    target = models.CharField(max_length=128)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        # The console's powers, one per kind of action (admin_console.access.console_power);
        # reading the console needs staff alone. The group "Console administrators" has them all.
        permissions = [
            ("manage_workers", "Can drain workers and set the warm pool"),
            ("manage_limits", "Can change the tiers' rate limits"),
            ("manage_variants", "Can change variants, the canary and experiments"),
            ("manage_api_keys", "Can issue, limit and revoke API keys"),
            ("manage_help_center", "Can edit help articles and pinned answers"),
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {self.actor_name}: {self.action} {self.target}"

    def changes(self) -> list[tuple[str, object, object]]:
        """(field, before, after) for every field whose value differs, by field name.

        By name, because the stored key order is the database's: SQLite keeps the writer's,
        PostgreSQL's jsonb its own (shorter keys first).
        """
        before, after = self.before or {}, self.after or {}
        return [
            (name, before.get(name), after.get(name))
            for name in sorted({*before, *after})
            if before.get(name) != after.get(name)
        ]


RULE_NAMES = {"error_rate": "error-rate", "ttft_p95": "TTFT p95", "thumbs_down": "thumbs-down"}


def validate_canary_steps(steps: Any) -> None:
    """A plan is a list of {"percent", "hold_s"}: percentages rising from 1 to a last step of 100."""
    if not isinstance(steps, list) or not steps:
        raise ValidationError("The plan needs at least one step.")
    previous = 0
    for step in steps:
        percent, hold_s = step.get("percent"), step.get("hold_s")
        if not isinstance(percent, int) or not 1 <= percent <= 100:
            raise ValidationError("Each step's split is a whole percentage from 1 to 100.")
        if percent <= previous:
            raise ValidationError("Each step's split must be larger than the one before.")
        if not isinstance(hold_s, int) or hold_s < 0:
            raise ValidationError("Each step's hold is a whole number of seconds, 0 or more.")
        previous = percent
    if previous != 100:
        raise ValidationError("The last step must send 100% of new conversations to the candidate.")


# The console's powers (AuditLog's permissions), and the group that has them all.
CONSOLE_POWERS = tuple(codename for codename, _ in AuditLog._meta.permissions)
CONSOLE_ADMINISTRATORS = "Console administrators"


class CanaryRollout(models.Model):
    """One canary release of `candidate_variant` against `stable_variant`.

    While it runs, a periodic evaluation compares the two variants' recent answers and either
    rolls the candidate back (split to 0, numbers recorded here) or, once a step has been held
    long enough with enough answers, moves the split to the plan's next step; after the last
    step the candidate is promoted to stable.
    """

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        PROMOTED = "promoted", "Promoted"
        ROLLED_BACK = "rolled_back", "Rolled back"

    stable_variant = models.CharField(max_length=64)
    candidate_variant = models.CharField(max_length=64)
    # [{"percent": 5, "hold_s": 300}, ...], percentages rising, the last one 100.
    steps = models.JSONField(validators=[validate_canary_steps])
    max_error_rate_increase_points = models.FloatField(
        default=5.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text="Roll back when the candidate's error rate exceeds stable's by more than this "
        "many percentage points.",
    )
    max_ttft_p95_ratio = models.FloatField(
        default=1.5,
        validators=[MinValueValidator(1.0)],
        help_text="Roll back when the candidate's p95 time to first token exceeds stable's times this.",
    )
    max_thumbs_down_increase_points = models.FloatField(
        default=10.0,
        validators=[MinValueValidator(0.0), MaxValueValidator(100.0)],
        help_text="Roll back when the candidate's share of thumbs-down votes exceeds stable's by more "
        "than this many percentage points.",
    )
    min_answers = models.PositiveIntegerField(
        default=20,
        validators=[MinValueValidator(1)],
        help_text="Answers each variant needs in the window before error rate and TTFT are compared, "
        "and the candidate needs before a step advances.",
    )
    min_votes = models.PositiveIntegerField(
        default=10,
        validators=[MinValueValidator(1)],
        help_text="Thumbs votes each variant needs in the window before they are compared.",
    )
    window_s = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(10)], help_text="How far back the comparison looks."
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    started_at = models.DateTimeField(auto_now_add=True)
    step_started_at = models.DateTimeField()  # when the split last changed; holds count from here
    ended_at = models.DateTimeField(null=True, blank=True)
    automatic = models.BooleanField(default=False)  # ended by the evaluation, not by staff
    # Why it was rolled back: the rules that broke, or "manual".
    rollback_reason = models.CharField(max_length=128, blank=True)
    # The per-variant numbers and limits behind the rollback, as the evaluation saw them.
    rollback_numbers = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["status"], condition=models.Q(status="running"), name="one_running_canary"
            )
        ]

    def __str__(self) -> str:
        return f"canary {self.candidate_variant} vs {self.stable_variant} ({self.status})"

    def rollback_reason_display(self) -> str:
        """The rules an automatic rollback broke: "error_rate, ttft_p95" -> "the error-rate and
        TTFT p95 rules"."""
        names = [RULE_NAMES.get(rule, rule) for rule in self.rollback_reason.split(", ")]
        if len(names) == 1:
            return f"the {names[0]} rule"
        return f"the {', '.join(names[:-1])} and {names[-1]} rules"

    # The plan continues from wherever the split stands, so a manual split change needs no
    # separate "paused" state: the next step is the first one above the split.

    def next_percent(self, split_percent: int) -> int | None:
        """The split of the plan's next step, or None when the plan is complete."""
        return next((step["percent"] for step in self.steps if step["percent"] > split_percent), None)

    def hold_s(self, split_percent: int) -> int:
        """How long the current split is held before moving on: its step's hold (the first
        step's while the split is below the plan)."""
        reached = [step for step in self.steps if step["percent"] <= split_percent]
        return (reached[-1] if reached else self.steps[0])["hold_s"]


class QualityRun(models.Model):
    """One quality score of a variant (knowledge.quality), started from the canary page and run
    by a Celery task. A candidate is promoted only when its latest score is at least stable's."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    variant = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    # The settings the questions were asked with (knowledge.quality.VariantSettings).
    variant_settings = models.JSONField()
    answered = models.PositiveIntegerField(default=0)
    questions = models.PositiveIntegerField(default=0)
    overall = models.FloatField(null=True, blank=True)
    # facts, sources, dont_know, language, overall, questions, failed (QualityScore.breakdown).
    breakdown = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["variant", "status", "-finished_at"])]

    def __str__(self) -> str:
        return f"quality of {self.variant} ({self.status})"
