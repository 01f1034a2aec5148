"""Accounts (with their tier), conversations and messages."""

import uuid

from django.contrib.auth.models import AbstractUser
from django.db import models


class User(AbstractUser):
    class Tier(models.TextChoices):
        NORMAL = "normal", "Normal"
        VIP = "vip", "VIP"

    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.NORMAL)


class Conversation(models.Model):
    """Owned by an account, or by a guest's session when `owner` is empty."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(User, null=True, blank=True, on_delete=models.CASCADE)
    session_key = models.CharField(max_length=40, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"  # queued or generating
        DONE = "done", "Done"
        CANCELLED = "cancelled", "Cancelled"
        ERROR = "error", "Error"

    class Feedback(models.IntegerChoices):
        UP = 1, "Thumbs up"
        DOWN = -1, "Thumbs down"

    conversation = models.ForeignKey(Conversation, related_name="messages", on_delete=models.CASCADE)
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DONE)
    # Assistant messages only: the generation request that writes them.
    request_id = models.UUIDField(null=True, blank=True, unique=True)
    variant = models.CharField(max_length=64, blank=True)
    engine = models.CharField(max_length=128, blank=True)  # e.g. "simulated", "vllm:SmolLM2-..."
    finish_reason = models.CharField(max_length=32, blank=True)
    error_code = models.CharField(max_length=32, blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    # Assistant messages only: the help articles its prompt quoted, [{"slug", "title"}], best first.
    sources = models.JSONField(default=list, blank=True)
    # The asker's thumbs on a finished answer; the canary compares variants by it.
    feedback = models.SmallIntegerField(choices=Feedback.choices, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(fields=["conversation", "status"]),
            # The canary's per-variant numbers over a recent window.
            models.Index(fields=["variant", "completed_at"]),
        ]


class ApiKey(models.Model):
    """A key for the OpenAI-compatible API. Only its SHA-256 is stored: the key itself is shown
    once, when it is made; `prefix` (its start) is what lists and revocation refer to."""

    owner = models.ForeignKey(User, related_name="api_keys", on_delete=models.CASCADE)
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64, unique=True)
    # Empty: the owner's tier, so a customer promoted to VIP brings their keys along.
    tier = models.CharField(max_length=16, choices=User.Tier.choices, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
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


class BatchJob(models.Model):
    """Chat requests submitted together and answered in the `batch` tier, polled for results."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        CANCELLED = "cancelled", "Cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(User, related_name="batch_jobs", on_delete=models.CASCADE)
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    # The Celery task feeding the job holds it until `lease_expires_at`; an empty `runner` means
    # no task holds it and the next may take it at once (see chat.jobs).
    runner = models.CharField(max_length=32, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "lease_expires_at"])]


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
    request = models.JSONField()  # the validated generation parameters (messages, max_tokens...)
    # Set before the request is submitted, so a resumed job finds it again instead of asking twice.
    request_id = models.UUIDField(null=True, blank=True, unique=True)
    variant = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    content = models.TextField(blank=True)
    finish_reason = models.CharField(max_length=32, blank=True)
    error_code = models.CharField(max_length=32, blank=True)
    error_message = models.TextField(blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="batch_job_item_index_unique")]
        indexes = [models.Index(fields=["job", "status"])]
