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
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["conversation", "status"])]
