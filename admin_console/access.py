"""Who may use the console, for its views and its live socket alike: active staff accounts."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

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
