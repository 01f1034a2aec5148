"""Sign-in, throttled: the customers' form and the Django admin's go through `login_throttled`."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts import login_throttle
from accounts.addresses import client_address


def login_throttled(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A sign-in view whose posts are counted before the password is checked: too many failures
    for a username, or from an address, and further attempts are refused with 429 and
    Retry-After (see accounts.login_throttle) whatever password they carry."""

    @functools.wraps(view)
    def throttled(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        attempt = login_throttle.LoginAttempt(
            username=request.POST.get("username", ""), address=client_address(request)
        )
        retry_after_s = login_throttle.login_attempt_begin(attempt)
        if retry_after_s:
            return _refusal(request, retry_after_s)
        response = view(request, *args, **kwargs)
        # Signed in as the username tried (not merely signed in already, as someone else).
        signed_in = request.user.is_authenticated and request.user.get_username()
        if signed_in and signed_in.casefold() == attempt.username.casefold():
            login_throttle.login_succeeded(attempt)
        return response

    return throttled


def _refusal(request: HttpRequest, retry_after_s: int) -> HttpResponse:
    minutes = math.ceil(retry_after_s / 60)
    refusal = (
        f"Too many failed sign-in attempts. Please try again in {minutes} minute{'s' if minutes > 1 else ''}."
    )
    response = render(request, "registration/login_refused.html", {"refusal": refusal}, status=429)
    response["Retry-After"] = str(retry_after_s)
    return response


login = login_throttled(auth_views.LoginView.as_view(redirect_authenticated_user=True))
