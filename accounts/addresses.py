"""The client's network address, which signing in and guests' limits count attempts against."""

from __future__ import annotations

import functools
import logging

from django.http import HttpRequest

from accounts.metrics import FORWARDED_FOR_UNTRUSTED
from scheduler.networks import forwarded_client, proxy_trusted

logger = logging.getLogger(__name__)


@functools.cache
def _warn_forwarded_for_ignored() -> None:
    logger.warning(
        "A request came with X-Forwarded-For from a peer not in TRUSTED_PROXIES, so the header is "
        "ignored and every client behind that proxy shares its address (and its rate limits). Set "
        "TRUSTED_PROXIES to the proxy's address or network (llm_forwarded_for_untrusted_total "
        "counts these requests)."
    )


def client_address(request: HttpRequest) -> str:
    """The client's network address: the peer, or the address the trusted proxies in front of us
    saw."""
    return peer_client_address(request.META.get("REMOTE_ADDR", ""), request.headers.get("X-Forwarded-For"))


def peer_client_address(peer: str, forwarded_for: str | None) -> str:
    """`client_address` for code that has the peer's address and the header but no request."""
    if not forwarded_for:
        return peer
    if proxy_trusted(peer):
        return forwarded_client(forwarded_for)
    FORWARDED_FOR_UNTRUSTED.inc()
    _warn_forwarded_for_ignored()
    return peer
