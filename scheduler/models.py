"""The tier policies, the model variants, the canary split and the warm pool's size (stored
here, mirrored into Redis where admission, routing and the workers apply them), the fair share's
weights per origin, and the record of every generation request."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from scheduler.generation import Origin, SamplingParams, Tier
from scheduler.rules import tier_policy_problems

TIER_CHOICES = [(tier.value, tier.label) for tier in Tier]


class TierPolicy(models.Model):
    tier = models.CharField(max_length=16, choices=TIER_CHOICES, primary_key=True)
    bucket_capacity = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Burst one client may send."
    )
    refill_per_s = models.FloatField(
        validators=[MinValueValidator(0.001)], help_text="Messages per second a client regains."
    )
    tier_bucket_capacity = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Burst the whole tier may send."
    )
    tier_refill_per_s = models.FloatField(
        validators=[MinValueValidator(0.001)], help_text="Messages per second the tier regains."
    )
    max_concurrent_per_user = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Unfinished requests one client may have."
    )
    max_queued = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Longest the tier's queue may grow."
    )
    wait_slo_s = models.FloatField(
        validators=[MinValueValidator(0.1)], help_text="Longest predicted wait still admitted."
    )
    max_wait_s = models.FloatField(
        validators=[MinValueValidator(0.1)], help_text="A queued request older than this expires."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "tier policies"

    def __str__(self) -> str:
        return f"{self.tier} policy"

    def clean(self) -> None:
        # Warnings (a policy that may fail under load) are left to `manage.py check`.
        if self.wait_slo_s is None or self.max_wait_s is None:
            return
        errors: dict[str, list[str]] = {}
        for problem in tier_policy_problems(
            tier=self.tier, wait_slo_s=self.wait_slo_s, max_wait_s=self.max_wait_s
        ):
            if problem.level == "error":
                errors.setdefault(problem.field, []).append(f"{problem.message} {problem.hint}")
        if errors:
            raise ValidationError(errors)


class Variant(models.Model):
    """One way of answering, as data: the model, the system prompt, the sampling defaults,
    whether the help center feeds the prompt, and what to say when it has nothing. Staff edit
    variants in the console (audited).

    Variants on the same `model` share its workers: the web builds the prompt and sampling from
    the variant and the queued job carries them, so one worker and one model answer a stable
    and a candidate that differ in prompt or sampling. Which variant is stable and which is the
    canary's candidate is not a field here: CanaryRouting says it (the console's canary moves
    it), so there is one owner of that role.
    """

    name = models.SlugField(max_length=64, unique=True)
    model = models.CharField(
        max_length=128,
        help_text="The model's serving name: workers whose INFERENCE_MODEL_NAME is this answer the variant.",
    )
    system_prompt = models.TextField(help_text="Comes first in every chat prompt of this variant.")
    temperature = models.FloatField(validators=[MinValueValidator(0.0), MaxValueValidator(2.0)])
    top_p = models.FloatField(validators=[MinValueValidator(0.01), MaxValueValidator(1.0)])
    max_tokens = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(4096)])
    # OpenAI's and vLLM's: each time a token was written in the answer, it is this much less
    # likely again. A small model decoding greedily otherwise repeats its first sentence until
    # the token limit; unlike vLLM's repetition penalty it spares the prompt, whose facts the
    # answer should repeat.
    frequency_penalty = models.FloatField(
        default=0.0, validators=[MinValueValidator(-2.0), MaxValueValidator(2.0)]
    )

    class AnswerStyle(models.TextChoices):
        GENERATED = "generated", "Generated: the model writes from the help center's excerpts"
        VERIFIED = "verified", "Verified: generated, each sentence checked against the excerpts"
        EXTRACTIVE = "extractive", "Extractive: the help center's own sentences, no model"

    knowledge = models.BooleanField(default=True, help_text="Answer from the help center's excerpts.")
    # How a chat answer is made from the help center (knowledge.answers); every style declines
    # when the help center does not answer (knowledge.declines).
    answer_style = models.CharField(
        max_length=16,
        choices=AnswerStyle.choices,
        default=AnswerStyle.EXTRACTIVE,
        help_text="How chat answers are made from the help center.",
    )
    # As `vllm serve --enable-auto-tool-choice --tool-call-parser <name>`: the worker reads the
    # model's tool calls out of its free text with this parser of vLLM's, for API calls that let
    # it choose (tool_choice "auto"). Blank: the model has no tool-call format, and "auto" is a 400.
    tool_call_parser = models.CharField(
        max_length=64,
        blank=True,
        help_text="The model's tool-call parser in vLLM (e.g. pythonic, hermes, llama3_json), for API "
        'calls with tool_choice "auto"; blank: such calls are refused.',
    )
    description = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def sampling(self) -> SamplingParams:
        """The chat's sampling for this variant (API callers choose their own)."""
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            frequency_penalty=self.frequency_penalty,
        )


class CanaryRouting(models.Model):
    """Which variant answers new conversations: one row, edited by the console's canary controls.

    `split_percent` of conversations go to `candidate_variant`, the rest to `stable_variant`;
    `salt` changes with each canary so that a different share of conversations tries each one.
    """

    stable_variant = models.CharField(max_length=64)
    candidate_variant = models.CharField(max_length=64, blank=True)
    split_percent = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)])
    salt = models.CharField(max_length=32, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(split_percent__lte=100), name="canary_split_at_most_100"
            )
        ]

    def __str__(self) -> str:
        return f"{self.split_percent}% {self.candidate_variant or '-'}, rest {self.stable_variant}"

    @property
    def stable_percent(self) -> int:
        return 100 - self.split_percent if self.candidate_variant else 100

    @classmethod
    def load(cls) -> CanaryRouting:
        """The one row, created on first use with the variant `stable` (made by a migration)."""
        routing, _ = cls.objects.get_or_create(pk=1, defaults={"stable_variant": "stable"})
        return routing


class Experiment(models.Model):
    """An A/B experiment: which of two variants serves customers better. Customers, not
    conversations, are split: `split_percent` of them are answered by `variant_a`, the rest by
    `variant_b`, each customer always by the same arm (a hash of the salt and the customer's id:
    the account, or the guest's client id). At most one runs; staff end it by keeping one arm.

    Beside the canary, which judges a candidate's stability on a share of conversations: the
    canary takes its share first, and the conversations it leaves to stable are answered by the
    customer's arm instead (scheduler.routing.variant_for)."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        ENDED = "ended", "Ended"

    variant_a = models.CharField(max_length=64)
    variant_b = models.CharField(max_length=64)
    split_percent = models.PositiveSmallIntegerField(
        default=50,
        validators=[MinValueValidator(1), MaxValueValidator(99)],
        help_text="Share of customers answered by the first variant; the rest get the second.",
    )
    salt = models.CharField(max_length=32)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    kept_variant = models.CharField(max_length=64, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["status"], condition=models.Q(status="running"), name="one_running_experiment"
            ),
            models.CheckConstraint(
                condition=models.Q(split_percent__gte=1, split_percent__lte=99),
                name="experiment_split_between_1_and_99",
            ),
        ]

    def __str__(self) -> str:
        return f"experiment {self.variant_a} vs {self.variant_b} ({self.status})"

    def clean(self) -> None:
        if self.variant_a and self.variant_a == self.variant_b:
            raise ValidationError({"variant_b": "An experiment compares two different variants."})

    @property
    def arms(self) -> tuple[str, str]:
        return self.variant_a, self.variant_b


class WarmPool(models.Model):
    """How many warm spare workers each variant keeps beyond the workers it needs: one row,
    edited in the console. A spare has its engine loaded and claims nothing until needed."""

    spares = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(16)])
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.spares} warm spares"

    @classmethod
    def load(cls) -> WarmPool:
        pool, _ = cls.objects.get_or_create(pk=1)
        return pool


class SourceWeight(models.Model):
    """How large a share of a tier one source of each origin gets beside the others when all
    are waiting (scheduler/fair_share.py): 2 serves twice the tokens of a source of weight 1.
    An origin without a row weighs 1; an API key may have its own (api.ApiKey)."""

    origin = models.CharField(max_length=16, choices=[(o.value, o.label) for o in Origin], primary_key=True)
    weight = models.FloatField(default=1.0, validators=[MinValueValidator(0.01), MaxValueValidator(100.0)])
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.origin} weight {self.weight}"


class CacheResult(models.TextChoices):
    MISS = "miss", "Miss"
    EXACT = "exact", "Exact match"
    SEMANTIC = "semantic", "Semantic match"
    PINNED = "pinned", "Pinned answer"


class Generation(models.Model):
    """One generation request, whatever door it came in by (chat, API, batch): created when it
    is admitted, finished once by its worker (scheduler.services.generation_finish). Chat
    messages and batch items link here by request id; the canary and the console count these."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"  # queued or generating
        DONE = "done", "Done"
        CANCELLED = "cancelled", "Cancelled"
        ERROR = "error", "Error"

    request_id = models.UUIDField(unique=True)
    origin = models.CharField(max_length=16, choices=[(o.value, o.label) for o in Origin])
    variant = models.CharField(max_length=64)
    model = models.CharField(max_length=128, blank=True)  # the queue it went to: its variant's model
    tier = models.CharField(max_length=16, choices=TIER_CHOICES)
    client_id = models.CharField(max_length=128, blank=True)
    # Which of its call's n choices it answers (scheduler.generation.GenerationJob.choice).
    choice = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    finish_reason = models.CharField(max_length=32, blank=True)
    error_code = models.CharField(max_length=32, blank=True)
    error_message = models.TextField(blank=True)
    text = models.TextField(blank=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    queue_ms = models.FloatField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    engine = models.CharField(max_length=128, blank=True)  # e.g. "simulated", "vllm:SmolLM2-..."
    # The result cache's verdict on a request it looked up (blank: not looked up, e.g. a later
    # turn or a question with personal data), how long the lookup took, and for a hit the
    # engine time of the answer it served instead of generating one.
    cache = models.CharField(max_length=16, choices=CacheResult.choices, blank=True)
    cache_lookup_ms = models.FloatField(null=True, blank=True)
    saved_engine_ms = models.FloatField(null=True, blank=True)
    # A chat answer's check against the help center (scheduler.generation.GroundingReport).
    grounding = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # The canary's per-variant numbers over a recent window.
            models.Index(fields=["variant", "finished_at"]),
            # The console's cache figures over a recent window.
            models.Index(fields=["created_at", "cache"]),
            # Each API key's usage per day (api.usage).
            models.Index(fields=["origin", "created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.origin} {self.request_id} ({self.status})"


def generation_link(related_name: str) -> models.OneToOneField:
    """A link from a row of a web app to the generation that writes its answer. No database
    constraint: the generation is made by admission, after the linking row."""
    return models.OneToOneField(
        Generation,
        to_field="request_id",
        db_column="request_id",
        db_constraint=False,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name=related_name,
    )
