"""Forms of the console: they parse and validate; the services make the change."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from accounts.models import ACCOUNT_TIER_CHOICES, User
from admin_console.models import CanaryRollout, validate_canary_steps
from admin_console.services import canary as canary_services
from admin_console.services import limits as limits_services
from admin_console.services import variants as variants_services
from api.models import ApiKey
from chat.models import AgentProfile, HandoffSettings
from knowledge.models import Article
from scheduler.generation import Origin
from scheduler.models import TierPolicy, Variant


class TierPolicyForm(forms.ModelForm):
    class Meta:
        model = TierPolicy
        fields = limits_services.POLICY_FIELDS
        labels = {
            "bucket_capacity": "Burst per client",
            "refill_per_s": "Refill per client (messages/s)",
            "tier_bucket_capacity": "Burst for the tier",
            "tier_refill_per_s": "Refill for the tier (messages/s)",
            "max_concurrent_per_user": "Unfinished answers per client",
            "max_queued": "Queue bound",
            "wait_slo_s": "Longest predicted wait admitted (s)",
            "max_wait_s": "Expiry of a queued request (s)",
        }


class VariantForm(forms.ModelForm):
    """A variant's model, prompt, sampling and help-center switch. Never saved directly: the
    views hand cleaned_data to services.variants (variant_create or variant_update)."""

    class Meta:
        model = Variant
        fields = ("name", *variants_services.VARIANT_FIELDS)
        labels = {
            "model": "Model (the workers' INFERENCE_MODEL_NAME)",
            "max_tokens": "Longest answer (tokens)",
            "knowledge": "Answer from the help center",
            "tool_call_parser": "Tool-call parser (vLLM's --tool-call-parser)",
        }
        widgets = {"system_prompt": forms.Textarea(attrs={"rows": 4})}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            del self.fields["name"]  # the canary, records and metrics know a variant by its name


class AnswerPinForm(forms.Form):
    variant = forms.ChoiceField(label="Variant")
    question = forms.CharField(label="Question", max_length=500)
    answer = forms.CharField(
        label="Approved answer", widget=forms.Textarea(attrs={"rows": 4}), max_length=4000
    )

    def __init__(self, *args: Any, variants: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["variant"].choices = [(name, name) for name in variants]


def _whole_numbers(text: str, what: str) -> list[int]:
    """ "5, 20, 50, 100" or "5 → 20 → 50 → 100" -> [5, 20, 50, 100]."""
    parts = [part for part in re.split(r"[\s,;→>]+", text) if part]
    try:
        return [int(part) for part in parts]
    except ValueError as exc:
        raise ValidationError(f"{what}: whole numbers separated by commas, e.g. 5, 20, 50, 100.") from exc


class CanaryStartForm(forms.ModelForm):
    """The candidate, the step plan and the rollback rules. Never saved directly: the view hands
    cleaned_data to services.canary.canary_start."""

    candidate_variant = forms.ChoiceField(
        label="Candidate variant", help_text="Variants that live workers serve, other than stable."
    )
    step_percents = forms.CharField(
        label="Steps (% of new conversations)",
        initial="5, 20, 50, 100",
        help_text="Rising percentages ending at 100; after the last step's hold the candidate is promoted.",
    )
    hold_seconds = forms.CharField(
        label="Hold per step (seconds)",
        initial="300",
        help_text="One value for every step, or one per step.",
    )

    class Meta:
        model = CanaryRollout
        fields = canary_services.CANARY_RULE_FIELDS
        labels = {
            "max_error_rate_increase_points": "Error rate: candidate at most + points",
            "max_ttft_p95_ratio": "TTFT p95: candidate at most this many times stable",
            "max_thumbs_down_increase_points": "Thumbs down: candidate at most + points",
            "min_answers": "Answers needed per variant",
            "min_votes": "Votes needed per variant",
            "window_s": "Comparison window (seconds)",
        }

    PLAN_FIELDS = ("candidate_variant", "step_percents", "hold_seconds")

    def __init__(self, *args: Any, candidates: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["candidate_variant"].choices = [(variant, variant) for variant in candidates]

    def plan_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.PLAN_FIELDS]

    def rule_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in canary_services.CANARY_RULE_FIELDS]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if "step_percents" not in cleaned or "hold_seconds" not in cleaned:
            return cleaned
        try:
            percents = _whole_numbers(cleaned["step_percents"], "Steps")
        except ValidationError as exc:
            self.add_error("step_percents", exc)
            return cleaned
        try:
            holds = _whole_numbers(cleaned["hold_seconds"], "Hold")
            if len(holds) == 1:
                holds *= len(percents)
            if len(holds) != len(percents):
                raise ValidationError("Give one hold for every step, or a single one for all steps.")
        except ValidationError as exc:
            self.add_error("hold_seconds", exc)
            return cleaned
        steps = [{"percent": p, "hold_s": h} for p, h in zip(percents, holds, strict=True)]
        try:
            validate_canary_steps(steps)
        except ValidationError as exc:
            self.add_error("step_percents", exc)
            return cleaned
        cleaned["steps"] = steps
        return cleaned

    def rules(self) -> dict[str, Any]:
        return {name: self.cleaned_data[name] for name in canary_services.CANARY_RULE_FIELDS}


class CanarySplitForm(forms.Form):
    split_percent = forms.IntegerField(
        label="Split (% of new conversations to the candidate)", min_value=0, max_value=100
    )


class QualityRunForm(forms.Form):
    variant = forms.ChoiceField(label="Variant")

    def __init__(self, *args: Any, variants: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["variant"].choices = [(variant, variant) for variant in variants]


class WarmSparesForm(forms.Form):
    spares = forms.IntegerField(label="Warm spares per model", min_value=0, max_value=16)


class ApiKeyCreateForm(forms.Form):
    owner = forms.CharField(label="Owner (username)", max_length=150)
    name = forms.CharField(label="Name", max_length=100, required=False, help_text="What the key is for.")
    tier = forms.ChoiceField(
        label="Tier", choices=[("", "The owner's tier"), *ACCOUNT_TIER_CHOICES], required=False
    )

    def clean_owner(self) -> User:
        try:
            return User.objects.get(username=self.cleaned_data["owner"])
        except User.DoesNotExist as exc:
            raise forms.ValidationError("There is no account with this username.") from exc


class ApiKeyLimitsForm(forms.ModelForm):
    class Meta:
        model = ApiKey
        fields = ("requests_per_minute", "tokens_per_minute", "fair_share_weight")
        labels = {
            "requests_per_minute": "Requests/min",
            "tokens_per_minute": "Tokens/min",
            "fair_share_weight": "Share weight",
        }


class SourceWeightsForm(forms.Form):
    """The fair share's weight of each origin: how many tokens one of its sources is served for
    each token of a source of weight 1 while both wait in a tier."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for origin in Origin:
            self.fields[str(origin)] = forms.FloatField(
                label=f"{origin.label} weight", min_value=0.01, max_value=100.0
            )


class ArticleForm(forms.ModelForm):
    """A help article's slug, title and Markdown body. Never saved directly: the views hand
    cleaned_data to services.articles (article_create or article_update)."""

    class Meta:
        model = Article
        fields = ["title", "slug", "body"]
        labels = {"slug": "Address", "body": "Text (Markdown)"}
        help_texts = {
            "slug": "The article's page is /help/<address>; answers link to it.",
            "body": "Sections start with ## headings; each section is quoted on its own in answers.",
        }
        widgets = {"body": forms.Textarea(attrs={"rows": 18, "class": "mono"})}


class AgentProfileForm(forms.ModelForm):
    class Meta:
        model = AgentProfile
        fields = ["display_name", "capacity"]


class HandoffTargetForm(forms.ModelForm):
    class Meta:
        model = HandoffSettings
        fields = ["first_response_target_s"]
        labels = {"first_response_target_s": "First-response target (s)"}


class ExperimentStartForm(forms.Form):
    variant_a = forms.ChoiceField(label="First variant")
    variant_b = forms.ChoiceField(label="Second variant")
    split_percent = forms.IntegerField(
        min_value=1, max_value=99, initial=50, label="Customers on the first variant (%)"
    )

    def __init__(self, *args: Any, variants: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [(name, name) for name in variants]
        self.fields["variant_a"].choices = choices
        self.fields["variant_b"].choices = choices

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("variant_a") and cleaned.get("variant_a") == cleaned.get("variant_b"):
            raise forms.ValidationError("An experiment compares two different variants.")
        return cleaned
