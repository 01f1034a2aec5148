"""The result cache page, staff only: parse, check access, call one service or selector, render."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from admin_console.access import console_power, staff_required
from admin_console.forms import AnswerPinForm
from admin_console.selectors import cache as cache_selectors
from admin_console.selectors import variants as variants_selectors
from admin_console.services import cache as cache_services
from admin_console.services.audit import ConsoleError
from admin_console.views.page import _render
from knowledge.models import CachedAnswer


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
