"""Conversations and messages.

Answers are not stored here: an assistant message links to the scheduler's record of its
generation (scheduler.models.Generation) by request id.
"""

import uuid

from django.conf import settings
from django.db import models

from scheduler.models import generation_link


class Conversation(models.Model):
    """Owned by an account, or by a guest's session when `owner` is empty."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    session_key = models.CharField(max_length=40, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    class Feedback(models.IntegerChoices):
        UP = 1, "Thumbs up"
        DOWN = -1, "Thumbs down"

    conversation = models.ForeignKey(Conversation, related_name="messages", on_delete=models.CASCADE)
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)  # user messages; an answer's text is its generation's
    # Assistant messages only: the generation that writes the answer.
    generation = generation_link("message")
    # Assistant messages only: the help articles its prompt quoted, [{"slug", "title"}], best first.
    sources = models.JSONField(default=list, blank=True)
    # The asker's thumbs on a finished answer; the canary compares variants by it.
    feedback = models.SmallIntegerField(choices=Feedback.choices, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
