"""Console section for API keys, staff only: list, issue (the key is shown once), revoke.

Mounted by adding `api_key_urlpatterns` to the console's urlpatterns (namespace `console`).
Under htmx the section re-renders in place; otherwise it is a page of its own.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import path
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_GET, require_POST

from admin_console import services
from chat import api_keys as key_services
from chat.api_keys import IssuedApiKey
from chat.models import ACCOUNT_TIER_CHOICES, ApiKey, User


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


def api_keys_context(
    *, form: ApiKeyCreateForm | None = None, issued: IssuedApiKey | None = None, notice: str = ""
) -> dict[str, Any]:
    """What `admin_console/_api_keys.html` needs, for pages that include the section."""
    return {
        "api_keys": key_services.api_key_list(),
        "api_key_form": form or ApiKeyCreateForm(),
        "issued": issued,
        "notice": notice,
    }


def _render(request: HttpRequest, context: dict[str, Any], status: int = 200) -> HttpResponse:
    template = "admin_console/_api_keys.html" if request.htmx else "admin_console/api_keys.html"
    return render(request, template, {"section": "api_keys", **context}, status=status)


@require_GET
@staff_member_required
def api_keys_page(request: HttpRequest) -> HttpResponse:
    return _render(request, api_keys_context())


@require_POST
@staff_member_required
def api_key_create(request: HttpRequest) -> HttpResponse:
    form = ApiKeyCreateForm(request.POST)
    if not form.is_valid():
        return _render(request, api_keys_context(form=form), status=400)
    issued = services.api_key_create(
        actor=request.user,
        owner=form.cleaned_data["owner"],
        name=form.cleaned_data["name"],
        tier=form.cleaned_data["tier"],
    )
    # Rendered, not redirected: the key must not travel through a session or a URL; and kept
    # out of every cache (`no-store`), so Back or a shared proxy cannot show it again.
    response = _render(request, api_keys_context(issued=issued), status=201)
    add_never_cache_headers(response)
    return response


@require_POST
@staff_member_required
def api_key_revoke(request: HttpRequest, key_id: int) -> HttpResponse:
    api_key = get_object_or_404(ApiKey, pk=key_id)
    if services.api_key_revoke(actor=request.user, api_key=api_key):
        notice = f"Revoked {api_key.prefix}…: calls with it now get 401."
    else:
        notice = f"{api_key.prefix}… was already revoked."
    return _render(request, api_keys_context(notice=notice))


api_key_urlpatterns = [
    path("api-keys", api_keys_page, name="api_keys"),
    path("api-keys/create", api_key_create, name="api_key_create"),
    path("api-keys/<int:key_id>/revoke", api_key_revoke, name="api_key_revoke"),
]
