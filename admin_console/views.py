"""Console views, staff only: parse, check access, call one service or selector, render."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from admin_console import tasks
from admin_console.access import console_power, staff_required
from admin_console.forms import (
    AnswerPinForm,
    ApiKeyCreateForm,
    ApiKeyLimitsForm,
    ArticleForm,
    CanarySplitForm,
    CanaryStartForm,
    QualityRunForm,
    SourceWeightsForm,
    TierPolicyForm,
    VariantForm,
    WarmSparesForm,
)
from admin_console.selectors import audit as audit_selectors
from admin_console.selectors import cache as cache_selectors
from admin_console.selectors import canary as canary_selectors
from admin_console.selectors import dashboard as dashboard_selectors
from admin_console.selectors import limits as limits_selectors
from admin_console.selectors import quality as quality_selectors
from admin_console.selectors import variants as variants_selectors
from admin_console.services import api_keys as api_keys_services
from admin_console.services import articles as articles_services
from admin_console.services import cache as cache_services
from admin_console.services import canary as canary_services
from admin_console.services import limits as limits_services
from admin_console.services import quality as quality_services
from admin_console.services import variants as variants_services
from admin_console.services import workers as workers_services
from admin_console.services.audit import ConsoleError
from api import keys as key_services
from api.keys import IssuedApiKey
from api.models import ApiKey
from api.usage import KeyUsage, key_usage_by_day
from knowledge import selectors as knowledge_selectors
from knowledge.embedding import EmbedderUnavailable
from knowledge.models import Article, CachedAnswer
from scheduler.models import TierPolicy, Variant


def _render(
    request: HttpRequest, template: str, section: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    """A console page: its nav `section`, and the banner of an automatic rollback if there is one."""
    return render(
        request,
        template,
        {"section": section, "rollback_alert": canary_selectors.automatic_rollback_alert(), **context},
        status=status,
    )


# --- dashboard and workers ---------------------------------------------------------------------


@require_GET
@staff_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return _render(
        request, "admin_console/dashboard.html", "dashboard", {"dashboard": dashboard_selectors.dashboard()}
    )


@require_GET
@staff_required
def dashboard_live(request: HttpRequest) -> HttpResponse:
    """The dashboard's numbers, re-fetched by htmx every 2 s."""
    return render(
        request, "admin_console/_live.html", {"dashboard": dashboard_selectors.dashboard(), "oob": True}
    )


@require_POST
@console_power("manage_workers")
def worker_drain(request: HttpRequest, worker_id: str) -> HttpResponse:
    try:
        workers_services.worker_drain(actor=request.user, worker_id=worker_id)
    except ConsoleError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Worker {worker_id} is draining: it finishes its answers, then stops.")
    return redirect("console:dashboard")


@require_POST
@console_power("manage_workers")
def warm_spares(request: HttpRequest) -> HttpResponse:
    form = WarmSparesForm(request.POST)
    if form.is_valid():
        workers_services.warm_spares_set(actor=request.user, spares=form.cleaned_data["spares"])
        messages.success(request, f"Each model keeps {form.cleaned_data['spares']} warm spares.")
    else:
        messages.error(request, "Warm spares: a whole number from 0 to 16.")
    return redirect("console:dashboard")


# --- model variants ----------------------------------------------------------------------------


def _variants_page(
    request: HttpRequest,
    *,
    bound: VariantForm | None = None,
    new: VariantForm | None = None,
    status: int = 200,
) -> HttpResponse:
    quality = quality_selectors.quality_latest_by_variant()
    grounding = variants_selectors.grounding_by_variant()
    rows = [
        (
            bound
            if bound is not None and bound.instance.name == variant.name
            else VariantForm(instance=variant, prefix=variant.name),
            quality.get(variant.name),
            grounding.get(variant.name),
        )
        for variant in variants_selectors.variants()
    ]
    return _render(
        request,
        "admin_console/variants.html",
        "variants",
        {"rows": rows, "new": new or VariantForm(prefix="new")},
        status=status,
    )


@require_GET
@staff_required
def variants(request: HttpRequest) -> HttpResponse:
    return _variants_page(request)


@require_POST
@console_power("manage_variants")
def variant_create(request: HttpRequest) -> HttpResponse:
    form = VariantForm(request.POST, prefix="new")
    if not form.is_valid():
        return _variants_page(request, new=form, status=400)
    values = dict(form.cleaned_data)
    try:
        variants_services.variant_create(actor=request.user, name=values.pop("name"), values=values)
    except ValidationError as exc:
        form.add_error(None, exc)
        return _variants_page(request, new=form, status=400)
    messages.success(request, f"Variant {form.cleaned_data['name']} added.")
    return redirect("console:variants")


@require_POST
@console_power("manage_variants")
def variant_update(request: HttpRequest, name: str) -> HttpResponse:
    variant = get_object_or_404(Variant, name=name)
    form = VariantForm(request.POST, instance=variant, prefix=name)
    if not form.is_valid():
        return _variants_page(request, bound=form, status=400)
    try:
        variants_services.variant_update(actor=request.user, name=name, changes=form.cleaned_data)
    except ValidationError as exc:
        form.add_error(None, exc)
        return _variants_page(request, bound=form, status=400)
    messages.success(request, f"Variant {name} saved: the next questions routed to it are asked this way.")
    return redirect("console:variants")


# --- result cache -----------------------------------------------------------------------------


def _variant_names() -> list[str]:
    return list(variants_selectors.variants().values_list("name", flat=True))


def _cache_page(request: HttpRequest, form: AnswerPinForm | None = None, status: int = 200) -> HttpResponse:
    context = {
        "figures": cache_selectors.cache_figures(),
        "pinned": cache_selectors.pinned_answers(),
        "form": form or AnswerPinForm(variants=_variant_names()),
    }
    return _render(request, "admin_console/cache.html", "cache", context, status=status)


@require_GET
@staff_required
def cache(request: HttpRequest) -> HttpResponse:
    return _cache_page(request)


@require_POST
@console_power("manage_help_center")
def answer_pin(request: HttpRequest) -> HttpResponse:
    form = AnswerPinForm(request.POST, variants=_variant_names())
    if not form.is_valid():
        return _cache_page(request, form, status=400)
    try:
        cache_services.cached_answer_pin(actor=request.user, **form.cleaned_data)
    except ConsoleError as exc:
        form.add_error(None, str(exc))
        return _cache_page(request, form, status=400)
    messages.success(request, "Answer pinned: it is served to the question and its paraphrases.")
    return redirect("console:cache")


@require_POST
@console_power("manage_help_center")
def answer_unpin(request: HttpRequest, entry_id: int) -> HttpResponse:
    try:
        cache_services.cached_answer_unpin(actor=request.user, entry_id=entry_id)
    except CachedAnswer.DoesNotExist as exc:
        raise Http404("No such pinned answer.") from exc
    messages.success(request, "Pinned answer removed.")
    return redirect("console:cache")


# --- rate limits -------------------------------------------------------------------------------


def _policy_forms(bound: TierPolicyForm | None = None) -> list[TierPolicyForm]:
    return [
        bound
        if bound is not None and bound.instance.tier == policy.tier
        else TierPolicyForm(instance=policy, prefix=policy.tier)
        for policy in limits_selectors.tier_policies()
    ]


def _limits_page(
    request: HttpRequest,
    *,
    policy_form: TierPolicyForm | None = None,
    weights_form: SourceWeightsForm | None = None,
    status: int = 200,
) -> HttpResponse:
    context = {
        "forms": _policy_forms(policy_form),
        "weights_form": weights_form or SourceWeightsForm(initial=limits_selectors.source_weights()),
    }
    return _render(request, "admin_console/limits.html", "limits", context, status=status)


@require_GET
@staff_required
def limits(request: HttpRequest) -> HttpResponse:
    return _limits_page(request)


@require_POST
@console_power("manage_limits")
def source_weights_update(request: HttpRequest) -> HttpResponse:
    form = SourceWeightsForm(request.POST)
    if form.is_valid():
        try:
            changed = limits_services.source_weights_set(actor=request.user, weights=form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(
                request,
                "The fair share's weights are saved and apply within a second."
                if changed
                else "The fair share kept its weights.",
            )
            return redirect("console:limits")
    return _limits_page(request, weights_form=form, status=400)


@require_POST
@console_power("manage_limits")
def limit_update(request: HttpRequest, tier: str) -> HttpResponse:
    try:
        policy = TierPolicy.objects.get(tier=tier)
    except TierPolicy.DoesNotExist as exc:
        raise Http404("No such tier.") from exc
    form = TierPolicyForm(request.POST, instance=policy, prefix=tier)
    if form.is_valid():
        try:
            limits_services.policy_update(actor=request.user, tier=tier, changes=form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(
                request, f"The {policy.get_tier_display()} policy is saved and applies within a second."
            )
            return redirect("console:limits")
    return _limits_page(request, policy_form=form, status=400)


# --- canary ------------------------------------------------------------------------------------


def _canary_page(
    request: HttpRequest,
    *,
    start_form: CanaryStartForm | None = None,
    split_form: CanarySplitForm | None = None,
    status: int = 200,
) -> HttpResponse:
    overview = canary_selectors.canary_overview()
    if start_form is None:
        start_form = CanaryStartForm(candidates=canary_selectors.canary_candidates())
    if split_form is None:
        split_form = CanarySplitForm(initial={"split_percent": overview.routing.split_percent})
    return _render(
        request,
        "admin_console/canary.html",
        "canary",
        {"overview": overview, "start_form": start_form, "split_form": split_form},
        status=status,
    )


@require_GET
@staff_required
def canary(request: HttpRequest) -> HttpResponse:
    return _canary_page(request)


@require_POST
@console_power("manage_variants")
def canary_start(request: HttpRequest) -> HttpResponse:
    form = CanaryStartForm(request.POST, candidates=canary_selectors.canary_candidates())
    if form.is_valid():
        try:
            canary_services.canary_start(
                actor=request.user,
                candidate_variant=form.cleaned_data["candidate_variant"],
                steps=form.cleaned_data["steps"],
                rules=form.rules(),
            )
        except (ConsoleError, ValidationError) as exc:
            form.add_error(None, exc if isinstance(exc, ValidationError) else str(exc))
        else:
            messages.success(request, f"Canary started: {form.cleaned_data['candidate_variant']}.")
            return redirect("console:canary")
    return _canary_page(request, start_form=form, status=400)


@require_POST
@console_power("manage_variants")
def canary_split(request: HttpRequest) -> HttpResponse:
    form = CanarySplitForm(request.POST)
    if form.is_valid():
        try:
            canary_services.canary_split_set(actor=request.user, percent=form.cleaned_data["split_percent"])
        except ConsoleError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Split set to {form.cleaned_data['split_percent']}%.")
            return redirect("console:canary")
    return _canary_page(request, split_form=form, status=400)


@require_POST
@console_power("manage_variants")
def canary_promote(request: HttpRequest) -> HttpResponse:
    try:
        rollout = canary_services.canary_promote(actor=request.user)
    except ConsoleError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{rollout.candidate_variant} is now the stable variant.")
    return redirect("console:canary")


@require_POST
@console_power("manage_variants")
def canary_rollback(request: HttpRequest) -> HttpResponse:
    try:
        rollout = canary_services.canary_rollback(actor=request.user)
    except ConsoleError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Rolled back: new conversations go to {rollout.stable_variant} again.")
    return redirect("console:canary")


@require_GET
@staff_required
def canary_quality(request: HttpRequest) -> HttpResponse:
    """The variants' quality scores, re-fetched by htmx every 2 s while one is running."""
    return render(request, "admin_console/_quality.html", {"overview": canary_selectors.canary_overview()})


@require_POST
@console_power("manage_variants")
def canary_quality_start(request: HttpRequest) -> HttpResponse:
    form = QualityRunForm(request.POST, variants=list(canary_selectors.canary_overview().quality))
    if not form.is_valid():
        messages.error(request, "Choose the stable variant, the candidate or a live variant to score.")
        return redirect("console:canary")
    try:
        run = quality_services.quality_run_start(actor=request.user, variant=form.cleaned_data["variant"])
    except ConsoleError as exc:
        messages.error(request, str(exc))
    else:
        tasks.quality_run_send(run.pk)
        messages.success(request, f"Quality score of {run.variant} started.")
    return redirect("console:canary")


# --- API keys (under htmx the section re-renders in place; otherwise it is a page of its own) ---

USAGE_DAYS = 7  # the usage the page sums beside today's


@dataclass(frozen=True, slots=True)
class _KeyRow:
    """One key as the console lists it: its limits form and its usage (today, last 7 days)."""

    key: ApiKey
    limits_form: ApiKeyLimitsForm
    today: KeyUsage
    week: KeyUsage


def _key_rows(invalid: ApiKeyLimitsForm | None) -> list[_KeyRow]:
    usage = key_usage_by_day(days=USAGE_DAYS)
    today = timezone.now().date()
    rows = []
    for key in key_services.api_key_list():
        days = usage.get(key.pk, {})
        form = invalid if invalid is not None and invalid.instance.pk == key.pk else None
        rows.append(
            _KeyRow(
                key=key,
                limits_form=form or ApiKeyLimitsForm(instance=key, prefix=f"key-{key.pk}"),
                today=days.get(today, KeyUsage()),
                week=sum(days.values(), KeyUsage()),
            )
        )
    return rows


def _api_keys_section(
    request: HttpRequest,
    *,
    form: ApiKeyCreateForm | None = None,
    limits_form: ApiKeyLimitsForm | None = None,
    issued: IssuedApiKey | None = None,
    notice: str = "",
    status: int = 200,
) -> HttpResponse:
    context = {
        "section": "api_keys",
        "key_rows": _key_rows(limits_form),
        "usage_days": USAGE_DAYS,
        "api_key_form": form or ApiKeyCreateForm(),
        "issued": issued,
        "notice": notice,
    }
    template = "admin_console/_api_keys.html" if request.htmx else "admin_console/api_keys.html"
    return render(request, template, context, status=status)


@require_GET
@staff_required
def api_keys(request: HttpRequest) -> HttpResponse:
    return _api_keys_section(request)


@require_POST
@console_power("manage_api_keys")
def api_key_create(request: HttpRequest) -> HttpResponse:
    form = ApiKeyCreateForm(request.POST)
    if not form.is_valid():
        return _api_keys_section(request, form=form, status=400)
    issued = api_keys_services.api_key_create(
        actor=request.user,
        owner=form.cleaned_data["owner"],
        name=form.cleaned_data["name"],
        tier=form.cleaned_data["tier"],
    )
    # Rendered, not redirected: the key must not travel through a session or a URL; and kept
    # out of every cache (`no-store`), so Back or a shared proxy cannot show it again.
    response = _api_keys_section(request, issued=issued, status=201)
    add_never_cache_headers(response)
    return response


@require_POST
@console_power("manage_api_keys")
def api_key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    api_key = get_object_or_404(ApiKey, pk=key_id)
    if api_keys_services.api_key_revoke(actor=request.user, api_key=api_key):
        notice = f"Revoked {api_key.prefix}…: calls with it now get 401."
    else:
        notice = f"{api_key.prefix}… was already revoked."
    return _api_keys_section(request, notice=notice)


@require_POST
@console_power("manage_api_keys")
def api_key_limits(request: HttpRequest, key_id: int) -> HttpResponse:
    api_key = get_object_or_404(ApiKey, pk=key_id)
    form = ApiKeyLimitsForm(request.POST, instance=api_key, prefix=f"key-{api_key.pk}")
    if not form.is_valid():
        return _api_keys_section(request, limits_form=form, status=400)
    changed = api_keys_services.api_key_limits_set(
        actor=request.user,
        api_key=api_key,
        requests_per_minute=form.cleaned_data["requests_per_minute"],
        tokens_per_minute=form.cleaned_data["tokens_per_minute"],
        fair_share_weight=form.cleaned_data["fair_share_weight"],
    )
    notice = f"Limits of {api_key.prefix}… saved." if changed else f"{api_key.prefix}… kept its limits."
    return _api_keys_section(request, notice=notice)


# --- help articles -----------------------------------------------------------------------------


@require_GET
@staff_required
def articles(request: HttpRequest) -> HttpResponse:
    context = {
        "articles": knowledge_selectors.articles_all(),
        "version": knowledge_selectors.knowledge_base_version(),
    }
    return _render(request, "admin_console/articles.html", "articles", context)


def _article_form_page(
    request: HttpRequest, form: ArticleForm, article: Article | None, status: int = 200
) -> HttpResponse:
    context = {"form": form, "article": article}
    return _render(request, "admin_console/article_form.html", "articles", context, status=status)


def _article_saved(request: HttpRequest, form: ArticleForm, article: Article | None) -> bool:
    """Create or update from a valid form; False (with the reason on the form) when refused."""
    try:
        if article is None:
            articles_services.article_create(actor=request.user, **form.cleaned_data)
        elif not articles_services.article_update(actor=request.user, article=article, **form.cleaned_data):
            messages.success(request, "Nothing changed.")
            return True
    except ValidationError as exc:
        form.add_error(None, exc)
        return False
    except EmbedderUnavailable as exc:
        form.add_error(None, f"Articles cannot be saved until the embedding model is prepared: {exc}")
        return False
    messages.success(request, f"Saved “{form.cleaned_data['title']}”: answers use it within a second or two.")
    return True


@require_http_methods(["GET", "POST"])
@console_power("manage_help_center")
def article_create(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _article_form_page(request, ArticleForm(), None)
    form = ArticleForm(request.POST)
    if form.is_valid() and _article_saved(request, form, None):
        return redirect("console:articles")
    return _article_form_page(request, form, None, status=400)


@require_http_methods(["GET", "POST"])
@console_power("manage_help_center")
def article_edit(request: HttpRequest, article_id: int) -> HttpResponse:
    article = get_object_or_404(Article, pk=article_id)
    if request.method == "GET":
        return _article_form_page(request, ArticleForm(instance=article), article)
    # A copy: the form writes cleaned values onto its instance, and the service compares them.
    form = ArticleForm(request.POST, instance=Article.objects.get(pk=article.pk))
    if form.is_valid() and _article_saved(request, form, article):
        return redirect("console:articles")
    return _article_form_page(request, form, article, status=400)


@require_POST
@console_power("manage_help_center")
def article_retire(request: HttpRequest, article_id: int) -> HttpResponse:
    article = get_object_or_404(Article, pk=article_id)
    articles_services.article_status_set(actor=request.user, article=article, status=Article.Status.RETIRED)
    messages.success(request, f"Retired “{article.title}”: answers stop quoting it within a second or two.")
    return redirect("console:articles")


@require_POST
@console_power("manage_help_center")
def article_restore(request: HttpRequest, article_id: int) -> HttpResponse:
    article = get_object_or_404(Article, pk=article_id)
    articles_services.article_status_set(actor=request.user, article=article, status=Article.Status.ACTIVE)
    messages.success(request, f"Restored “{article.title}”.")
    return redirect("console:articles")


# --- audit log ---------------------------------------------------------------------------------


@require_GET
@staff_required
def audit_log(request: HttpRequest) -> HttpResponse:
    return _render(request, "admin_console/audit.html", "audit", {"entries": audit_selectors.audit_entries()})
