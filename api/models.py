"""API keys and batch jobs of the OpenAI-compatible API.

A batch item's answer is not stored here: it links to the scheduler's record of its generation
(scheduler.models.Generation) by request id. The models came from the chat app and kept their
tables (`db_table`).
"""

import uuid

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from accounts.models import ACCOUNT_TIER_CHOICES, User
from scheduler.key_limits import KeyLimits
from scheduler.models import generation_link


class ApiKey(models.Model):
    """A key for the OpenAI-compatible API. Only its SHA-256 is stored: the key itself is shown
    once, when it is made; `prefix` (its start) is what lists and revocation refer to."""

    owner = models.ForeignKey(User, related_name="api_keys", on_delete=models.CASCADE)
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64, unique=True)
    # Empty: the owner's tier, so a customer promoted to VIP brings their keys along.
    tier = models.CharField(max_length=16, choices=ACCOUNT_TIER_CHOICES, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # The key's own limits, on top of its tier's; empty: unlimited (scheduler/key_limits.py).
    requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="Empty: unlimited."
    )
    tokens_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Prompt and completion tokens. Empty: unlimited.",
    )
    # Its share of its tier beside other sources (scheduler/fair_share.py); empty: the API's.
    fair_share_weight = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.01), MaxValueValidator(100.0)],
        help_text="Share beside other sources of its tier. Empty: the API's weight.",
    )

    class Meta:
        db_table = "chat_apikey"
        ordering = ["-created_at", "-id"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.owner})"

    @property
    def effective_tier(self) -> str:
        return self.tier or self.owner.tier

    @property
    def client_id(self) -> str:
        """Who admission's per-client limits count against."""
        return f"key:{self.pk}"

    @property
    def limits(self) -> KeyLimits:
        return KeyLimits(
            requests_per_minute=self.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute,
            fair_share_weight=self.fair_share_weight,
        )


class BatchJob(models.Model):
    """Chat requests submitted together and answered in the `batch` tier, polled for results."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        CANCELLED = "cancelled", "Cancelled"
        # Stopped because its API key was revoked: what was unanswered is cancelled.
        KEY_REVOKED = "key_revoked", "Key revoked"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(User, related_name="batch_jobs", on_delete=models.CASCADE)
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    # The Celery task feeding the job holds it until `lease_expires_at`; an empty `runner` means
    # no task holds it and the next may take it at once (see api.jobs).
    runner = models.CharField(max_length=32, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "chat_batchjob"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "lease_expires_at"])]

    @property
    def client_id(self) -> str:
        """Who admission's per-client limits count against: the owner, across all their jobs.
        Not `user:<id>`, whose in-flight requests are the owner's chat answers."""
        return f"jobs:{self.owner_id}"


class BatchJobItem(models.Model):
    """One chat request of a job and, once answered, its result."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"  # not yet admitted by the scheduler
        SUBMITTED = "submitted", "Submitted"  # queued or generating
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    job = models.ForeignKey(BatchJob, related_name="items", on_delete=models.CASCADE)
    index = models.PositiveIntegerField()
    request = models.JSONField()  # the validated request: messages and sampling parameters
    # Set before the request is submitted, so a resumed job finds it again instead of asking
    # twice; the answer is read through it.
    generation = generation_link("batch_item")
    # Routed when the id is reserved: the variant, and the model whose queue answers it.
    variant = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=128, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    submitted_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "chat_batchjobitem"
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="batch_job_item_index_unique")]
        indexes = [models.Index(fields=["job", "status"])]
