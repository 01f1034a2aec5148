"""The rate limits page, staff only: parse, check access, call one service or selector, render."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from admin_console.access import console_power, staff_required
from admin_console.forms import SourceWeightsForm, TierPolicyForm
from admin_console.selectors import limits as limits_selectors
from admin_console.services import limits as limits_services
from admin_console.views.page import _render
from scheduler.models import TierPolicy


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
