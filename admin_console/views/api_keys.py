"""The API keys page, staff only: parse, check access, call one service or selector, render.

Under htmx the section re-renders in place; otherwise it is a page of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_GET, require_POST

from admin_console.access import console_power, staff_required
from admin_console.forms import ApiKeyCreateForm, ApiKeyLimitsForm
from admin_console.services import api_keys as api_keys_services
from api import keys as key_services
from api.keys import IssuedApiKey
from api.models import ApiKey
from api.usage import KeyUsage, key_usage_by_day

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
