"""The canary page and its quality scores, staff only: parse, check access, call one service or
selector, render.
"""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from admin_console import tasks
from admin_console.access import console_power, staff_required
from admin_console.forms import CanarySplitForm, CanaryStartForm, QualityRunForm
from admin_console.selectors import canary as canary_selectors
from admin_console.services import canary as canary_services
from admin_console.services import quality as quality_services
from admin_console.services.audit import ConsoleError
from admin_console.views.page import _render


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
