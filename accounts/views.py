"""Sign-in, throttled."""

from __future__ import annotations

import math
from typing import Any

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse

from accounts import login_throttle
from accounts.addresses import client_address


class LoginView(auth_views.LoginView):
    """Django's sign-in, throttled: too many failures for a username, or from an address, and
    further attempts are refused with 429 (see accounts.login_throttle)."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        retry_after_s = login_throttle.login_retry_after_s(
            username=request.POST.get("username", ""), address=client_address(request)
        )
        if not retry_after_s:
            return super().post(request, *args, **kwargs)
        minutes = math.ceil(retry_after_s / 60)
        context = self.get_context_data(
            form=AuthenticationForm(request),
            refusal=f"Too many failed sign-in attempts. Please try again in {minutes} "
            f"minute{'s' if minutes > 1 else ''}.",
        )
        response = self.render_to_response(context, status=429)
        response["Retry-After"] = str(retry_after_s)
        return response

    def form_invalid(self, form: AuthenticationForm) -> HttpResponse:
        login_throttle.login_failed(
            username=self.request.POST.get("username", ""), address=client_address(self.request)
        )
        return super().form_invalid(form)

    def form_valid(self, form: AuthenticationForm) -> HttpResponse:
        login_throttle.login_succeeded(
            username=self.request.POST.get("username", ""), address=client_address(self.request)
        )
        return super().form_valid(form)
