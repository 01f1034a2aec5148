"""The A/B experiments page, staff's like the canary: parse, check access, call one service or
selector, render.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from admin_console.access import console_power, staff_required
from admin_console.forms import ExperimentStartForm
from admin_console.selectors import canary as canary_selectors
from admin_console.selectors import experiments as experiments_selectors
from admin_console.selectors import variants as variants_selectors
from admin_console.services import experiments as experiments_services
from admin_console.services.audit import ConsoleError
from chat.outcomes import MIN_FOR_MEAN, MIN_FOR_RATE, experiment_results, outcomes_by_variant


def _experiments_page(
    request: HttpRequest, form: ExperimentStartForm | None = None, status: int = 200
) -> HttpResponse:
    running = experiments_selectors.experiment_running()
    variants = list(variants_selectors.variants().values_list("name", flat=True))
    return render(
        request,
        "admin_console/experiments.html",
        {
            "section": "experiments",
            "rollback_alert": canary_selectors.automatic_rollback_alert(),
            "running": experiment_results(experiment=running) if running is not None else None,
            "ended": experiments_selectors.experiments_ended(),
            "form": form or ExperimentStartForm(variants=variants),
            "outcomes": outcomes_by_variant(),
            "window_days": f"{settings.HANDOFF_MEASURES_WINDOW_S / 86400:g}",
            "resolved_window_s": settings.ASSISTANT_RESOLVED_WINDOW_S,
            "min_rate": MIN_FOR_RATE,
            "min_mean": MIN_FOR_MEAN,
        },
        status=status,
    )


@require_GET
@staff_required
def experiments(request: HttpRequest) -> HttpResponse:
    return _experiments_page(request)


@require_POST
@console_power("manage_variants")
def experiment_start(request: HttpRequest) -> HttpResponse:
    form = ExperimentStartForm(
        request.POST, variants=list(variants_selectors.variants().values_list("name", flat=True))
    )
    if not form.is_valid():
        return _experiments_page(request, form, status=400)
    try:
        experiments_services.experiment_start(actor=request.user, **form.cleaned_data)
    except (ConsoleError, ValidationError) as exc:
        form.add_error(None, exc if isinstance(exc, ValidationError) else str(exc))
        return _experiments_page(request, form, status=400)
    messages.success(request, "Experiment started: each customer now meets one of the two variants.")
    return redirect("console:experiments")


@require_POST
@console_power("manage_variants")
def experiment_end(request: HttpRequest) -> HttpResponse:
    keep = request.POST.get("keep", "")
    try:
        experiments_services.experiment_end(actor=request.user, keep=keep)
    except ConsoleError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Experiment ended: {keep} answers every customer now.")
    return redirect("console:experiments")
