"""Console views, staff only: parse, check access, call one service or selector, render."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from admin_console import selectors, services
from admin_console.forms import CanarySplitForm, CanaryStartForm, TierPolicyForm
from scheduler.models import TierPolicy

View = Callable[..., HttpResponse]


def staff_required(view: View) -> View:
    """Visitors who are not signed in are sent to sign in; signed-in non-staff are refused."""

    @wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            return render(request, "admin_console/forbidden.html", status=403)
        return view(request, *args, **kwargs)

    return checked


def _render(
    request: HttpRequest, template: str, section: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    """A console page: its nav `section`, and the banner of an automatic rollback if there is one."""
    return render(
        request,
        template,
        {"section": section, "rollback_alert": selectors.automatic_rollback_alert(), **context},
        status=status,
    )


# --- dashboard and workers ---------------------------------------------------------------------


@require_GET
@staff_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return _render(request, "admin_console/dashboard.html", "dashboard", {"dashboard": selectors.dashboard()})


@require_GET
@staff_required
def dashboard_live(request: HttpRequest) -> HttpResponse:
    """The dashboard's numbers, re-fetched by htmx every 2 s."""
    return render(request, "admin_console/_live.html", {"dashboard": selectors.dashboard(), "oob": True})


@require_POST
@staff_required
def worker_drain(request: HttpRequest, worker_id: str) -> HttpResponse:
    try:
        services.worker_drain(actor=request.user, worker_id=worker_id)
    except services.ConsoleError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Worker {worker_id} is draining: it finishes its answers, then stops.")
    return redirect("console:dashboard")


# --- rate limits -------------------------------------------------------------------------------


def _policy_forms(bound: TierPolicyForm | None = None) -> list[TierPolicyForm]:
    return [
        bound
        if bound is not None and bound.instance.tier == policy.tier
        else TierPolicyForm(instance=policy, prefix=policy.tier)
        for policy in selectors.tier_policies()
    ]


@require_GET
@staff_required
def limits(request: HttpRequest) -> HttpResponse:
    return _render(request, "admin_console/limits.html", "limits", {"forms": _policy_forms()})


@require_POST
@staff_required
def limit_update(request: HttpRequest, tier: str) -> HttpResponse:
    try:
        policy = TierPolicy.objects.get(tier=tier)
    except TierPolicy.DoesNotExist as exc:
        raise Http404("No such tier.") from exc
    form = TierPolicyForm(request.POST, instance=policy, prefix=tier)
    if form.is_valid():
        try:
            services.policy_update(actor=request.user, tier=tier, changes=form.cleaned_data)
        except ValidationError as exc:
            form.add_error(None, exc)
        else:
            messages.success(
                request, f"The {policy.get_tier_display()} policy is saved and applies within a second."
            )
            return redirect("console:limits")
    return _render(request, "admin_console/limits.html", "limits", {"forms": _policy_forms(form)}, status=400)


# --- canary ------------------------------------------------------------------------------------


def _canary_page(
    request: HttpRequest,
    *,
    start_form: CanaryStartForm | None = None,
    split_form: CanarySplitForm | None = None,
    status: int = 200,
) -> HttpResponse:
    overview = selectors.canary_overview()
    if start_form is None:
        start_form = CanaryStartForm(candidates=selectors.canary_candidates())
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
@staff_required
def canary_start(request: HttpRequest) -> HttpResponse:
    form = CanaryStartForm(request.POST, candidates=selectors.canary_candidates())
    if form.is_valid():
        try:
            services.canary_start(
                actor=request.user,
                candidate_variant=form.cleaned_data["candidate_variant"],
                steps=form.cleaned_data["steps"],
                rules=form.rules(),
            )
        except (services.ConsoleError, ValidationError) as exc:
            form.add_error(None, exc if isinstance(exc, ValidationError) else str(exc))
        else:
            messages.success(request, f"Canary started: {form.cleaned_data['candidate_variant']}.")
            return redirect("console:canary")
    return _canary_page(request, start_form=form, status=400)


@require_POST
@staff_required
def canary_split(request: HttpRequest) -> HttpResponse:
    form = CanarySplitForm(request.POST)
    if form.is_valid():
        try:
            services.canary_split_set(actor=request.user, percent=form.cleaned_data["split_percent"])
        except services.ConsoleError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Split set to {form.cleaned_data['split_percent']}%.")
            return redirect("console:canary")
    return _canary_page(request, split_form=form, status=400)


@require_POST
@staff_required
def canary_promote(request: HttpRequest) -> HttpResponse:
    try:
        rollout = services.canary_promote(actor=request.user)
    except services.ConsoleError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{rollout.candidate_variant} is now the stable variant.")
    return redirect("console:canary")


@require_POST
@staff_required
def canary_rollback(request: HttpRequest) -> HttpResponse:
    try:
        rollout = services.canary_rollback(actor=request.user)
    except services.ConsoleError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Rolled back: new conversations go to {rollout.stable_variant} again.")
    return redirect("console:canary")


# --- audit log ---------------------------------------------------------------------------------


@require_GET
@staff_required
def audit_log(request: HttpRequest) -> HttpResponse:
    return _render(request, "admin_console/audit.html", "audit", {"entries": selectors.audit_entries()})
