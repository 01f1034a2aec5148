"""The live dashboard and its workers' actions, staff only: parse, check access, call one service
or selector, render.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from admin_console.access import console_power, staff_required
from admin_console.forms import WarmSparesForm
from admin_console.selectors import dashboard as dashboard_selectors
from admin_console.services import workers as workers_services
from admin_console.services.audit import ConsoleError
from admin_console.views.page import _render


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
