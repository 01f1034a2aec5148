"""Guests are known by a key in a signed cookie, given with the first page they see.

Not a stored session: a visit writes nothing to the database, and everything a guest sends at
once (a burst of first messages, two tabs) carries the same key, where lazily made sessions
would give each of those requests a session of its own.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.utils.crypto import salted_hmac
from django.utils.deprecation import MiddlewareMixin

COOKIE = "guest"
_SALT = "chat.guest"


def guest_key(request: HttpRequest) -> str:
    """The guest's key: from their cookie, or a new one that `guest_remember` then sets."""
    key = getattr(request, "_guest_key", None)
    if key is None:
        key = request.get_signed_cookie(COOKIE, default="", salt=_SALT)
        if not key:
            key = secrets.token_urlsafe(24)
            request._guest_key_is_new = True  # type: ignore[attr-defined]
        request._guest_key = key  # type: ignore[attr-defined]
    return key


def guest_key_known(request: HttpRequest) -> str:
    """The key the guest already holds, or "" (reading never makes one)."""
    return request.get_signed_cookie(COOKIE, default="", salt=_SALT)


def guest_key_in(cookies: dict[str, str]) -> str:
    """`guest_key_known` for code that has the request's cookies but no HttpRequest."""
    request = HttpRequest()
    request.COOKIES = cookies
    return guest_key_known(request)


def guest_client_id(key: str) -> str:
    """Who a guest is to admission's limits and to A/B experiments. The key opens the guest's
    conversations, so Redis keys and job payloads carry a keyed hash of it instead."""
    digest = salted_hmac("chat.guest-client-id", key, algorithm="sha256").hexdigest()
    return f"guest:{digest[:32]}"


def account_client_id(user_id: int) -> str:
    return f"user:{user_id}"


def guest_remember(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """Give the guest the cookie for a key made during this request."""
    if getattr(request, "_guest_key_is_new", False):
        response.set_signed_cookie(
            COOKIE,
            request._guest_key,  # type: ignore[attr-defined]
            salt=_SALT,
            max_age=settings.SESSION_COOKIE_AGE,
            secure=settings.SESSION_COOKIE_SECURE,
            httponly=True,
            samesite="Lax",
        )
    return response


def remembering(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A view after which a guest holds the cookie of any key made while it ran."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return guest_remember(request, view(request, *args, **kwargs))

    return wrapper


# --- the guest's cookie ends when someone signs in or out ----------------------------------------
# On a shared computer the next person would otherwise be the same guest, and see the previous
# one's conversations, after the first signed in, or after they signed out.


@receiver(user_logged_in, dispatch_uid="chat.guests.signed_in")
@receiver(user_logged_out, dispatch_uid="chat.guests.signed_out")
def _guest_end_on_sign_in_or_out(sender: type, request: HttpRequest | None, **kwargs: Any) -> None:
    if request is not None:
        request._guest_ends = True  # type: ignore[attr-defined]


class GuestEndMiddleware(MiddlewareMixin):
    """Deletes the guest's cookie in the response to a sign-in or a sign-out."""

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if getattr(request, "_guest_ends", False) and COOKIE in request.COOKIES:
            response.delete_cookie(COOKIE, samesite="Lax")
        return response
