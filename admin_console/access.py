"""Who may use the console, for its views and its live socket alike: active staff accounts
read it; each kind of action (workers, limits, variants, API keys, the help center) needs its
own permission as well (AuditLog's Meta: `admin_console.manage_*`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from admin_console.models import CONSOLE_POWERS

View = Callable[..., HttpResponse]


def is_console_user(user: AbstractBaseUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.is_active and getattr(user, "is_staff", False))


def staff_required(view: View) -> View:
    """Staff pass. A visitor who is not signed in and asked for a page is sent to sign in and
    comes back to it; everything else that is not staff (a customer, or a POST or htmx partial
    from a visitor, which cannot be resumed after signing in) is refused with 403."""

    @wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if is_console_user(request.user):
            return view(request, *args, **kwargs)
        resumable = request.method == "GET" and not getattr(request, "htmx", False)
        if not request.user.is_authenticated and resumable:
            return redirect_to_login(request.get_full_path())
        return render(request, "admin_console/forbidden.html", status=403)

    return checked


def console_power(codename: str) -> Callable[[View], View]:
    """Staff with the permission `admin_console.<codename>` pass; other staff are refused with
    403 (a page saying which permission is missing), and those who are not staff as by
    `staff_required`."""
    assert codename in CONSOLE_POWERS, codename

    def decorate(view: View) -> View:
        @wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not is_console_user(request.user):
                return staff_required(view)(request, *args, **kwargs)
            if request.user.has_perm(f"admin_console.{codename}"):
                return view(request, *args, **kwargs)
            return render(request, "admin_console/forbidden.html", {"missing_power": codename}, status=403)

        return checked

    return decorate


def is_agent(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Console staff with the agent permission: they answer customers (staff alone do not)."""
    return is_console_user(user) and user.has_perm("chat.agent")


def agent_required(view: View) -> View:
    """Agents pass. Those who are not staff are refused as everywhere in the console (a visitor
    asking for a page signs in first); staff without the agent permission get 403: a page
    saying why for a page, the JSON error for an action (the inbox's script shows its message)."""

    @wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if is_agent(request.user):
            return view(request, *args, **kwargs)
        if not is_console_user(request.user):
            return staff_required(view)(request, *args, **kwargs)
        wants_json = "application/json" in request.headers.get("Accept", "")
        if request.method == "GET" and not getattr(request, "htmx", False) and not wants_json:
            return render(request, "admin_console/forbidden.html", {"agents_only": True}, status=403)
        message = "Only agents answer customers: ask an administrator for the agent permission."
        return JsonResponse({"error": {"code": "not_an_agent", "message": message}}, status=403)

    return checked
