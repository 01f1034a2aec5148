"""Conversations and messages, and their hand-off to a person: each time one was asked for
(Handoff), the agents' private notes, the agents' profiles and the first-response target.

Answers are not stored here: an assistant message links to the scheduler's record of its
generation (scheduler.models.Generation) by request id.
"""

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from scheduler.models import generation_link


class Conversation(models.Model):
    """Owned by an account, or by a guest's session when `owner` is empty.

    `handoff_state` says who answers it (chat.handoff owns every change): the assistant; nobody
    yet, a person was asked for (waiting); a person from the team (agent, `assignee`); or a
    person resolved it (resolved)."""

    class HandoffState(models.TextChoices):
        ASSISTANT = "assistant", "With the assistant"
        WAITING = "waiting", "Waiting for a person"
        AGENT = "agent", "With a person"
        RESOLVED = "resolved", "Resolved by a person"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE)
    session_key = models.CharField(max_length=40, blank=True, db_index=True)
    handoff_state = models.CharField(
        max_length=16, choices=HandoffState.choices, default=HandoffState.ASSISTANT, db_index=True
    )
    # The agent answering it while it is with a person.
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="assigned_conversations",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        permissions = [("agent", "Can take over conversations as a person from the team")]


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"
        AGENT = "agent", "Agent"  # a person from the team, during a hand-off

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
    # Agent messages only: who sent it, and the display name the customer saw (never the
    # account's name), kept as it was when sent.
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    author_name = models.CharField(max_length=60, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]


class Handoff(models.Model):
    """One time a conversation went to a person: asked for, claimed by an agent, ended (resolved,
    handed back to the assistant, or withdrawn by the customer while waiting), and rated."""

    class Trigger(models.TextChoices):
        BUTTON = "button", "Talk to a person"
        WORDS = "words", "Asked in words"
        THUMBS_DOWN = "thumbs_down", "Offered after a second thumbs-down"
        DECLINE = "decline", "Offered under a decline"

    class Outcome(models.TextChoices):
        RESOLVED = "resolved", "Resolved"
        HANDED_BACK = "handed_back", "Handed back to the assistant"
        WITHDRAWN = "withdrawn", "Withdrawn by the customer"

    conversation = models.ForeignKey(Conversation, related_name="handoffs", on_delete=models.CASCADE)
    trigger = models.CharField(max_length=16, choices=Trigger.choices)
    vip = models.BooleanField(default=False)  # waiting VIP customers come first
    # Agents online when it was asked for: none means the customer was told so and left a question.
    agents_online = models.PositiveSmallIntegerField(default=0)
    requested_at = models.DateTimeField(default=timezone.now)
    agent = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    first_reply_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    rating = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(5)]
    )
    rating_comment = models.TextField(blank=True)
    rated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["requested_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["conversation"],
                condition=models.Q(ended_at__isnull=True),
                name="one_open_handoff_per_conversation",
            ),
            models.CheckConstraint(
                condition=models.Q(rating__isnull=True) | models.Q(rating__gte=1, rating__lte=5),
                name="handoff_rating_1_to_5",
            ),
        ]
        indexes = [
            # The waiting list (open, unclaimed) and the measures over a window.
            models.Index(fields=["ended_at", "claimed_at", "requested_at"]),
            models.Index(fields=["requested_at"]),
        ]

    def __str__(self) -> str:
        return f"hand-off of {self.conversation_id} ({self.outcome or 'open'})"


class AgentNote(models.Model):
    """A note agents leave on a conversation for each other, never shown to the customer. A
    model of its own rather than a kind of message, and with no way back from the conversation
    (`related_name="+"`), so that nothing that reads a conversation's messages can show one."""

    conversation = models.ForeignKey(Conversation, related_name="+", on_delete=models.CASCADE)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    author_name = models.CharField(max_length=60, blank=True)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]


class AgentProfile(models.Model):
    """What an agent sets: the name customers see, and how many conversations they take at once."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="agent_profile"
    )
    display_name = models.CharField(
        max_length=60, blank=True, help_text="The name customers see (never your account's name)."
    )
    capacity = models.PositiveSmallIntegerField(
        default=3,
        validators=[MinValueValidator(1), MaxValueValidator(20)],
        help_text="Conversations you answer at once.",
    )

    def __str__(self) -> str:
        return self.display_name or f"agent {self.user_id}"


class HandoffSettings(models.Model):
    """One row, edited in the inbox: the first-response target that colours waiting conversations."""

    first_response_target_s = models.PositiveIntegerField(
        default=120,
        validators=[MinValueValidator(10), MaxValueValidator(86400)],
        help_text="Seconds within which a waiting customer should hear from a person.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    @classmethod
    def load(cls) -> "HandoffSettings":
        row, _ = cls.objects.get_or_create(pk=1)
        return row
