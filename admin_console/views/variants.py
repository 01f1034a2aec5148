"""The model variants page, staff only: parse, check access, call one service or selector, render."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from admin_console.access import console_power, staff_required
from admin_console.forms import VariantForm
from admin_console.selectors import quality as quality_selectors
from admin_console.selectors import variants as variants_selectors
from admin_console.services import variants as variants_services
from admin_console.views.page import _render
from scheduler.models import Variant


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
