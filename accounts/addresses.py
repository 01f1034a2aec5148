"""The client's network address, which signing in and guests' limits count attempts against."""

from __future__ import annotations

import functools
import logging

from django.conf import settings
from django.http import HttpRequest

logger = logging.getLogger(__name__)


@functools.cache
def _warn_forwarded_for_ignored() -> None:
    logger.warning(
        "A request came with X-Forwarded-For, but TRUSTED_PROXIES is empty, so the header is "
        "ignored and every client behind the proxy shares the proxy's address (and its rate "
        "limit). Set TRUSTED_PROXIES to the proxy's address."
    )


def client_address(request: HttpRequest) -> str:
    """The client's network address: the peer, or the address the trusted proxy in front of us
    saw."""
    address = request.META.get("REMOTE_ADDR", "")
    forwarded = request.headers.get("X-Forwarded-For")
    if forwarded and address in settings.TRUSTED_PROXIES:
        address = forwarded.split(",")[-1].strip()
    elif forwarded and not settings.TRUSTED_PROXIES:
        _warn_forwarded_for_ignored()
    return address
