"""Addresses against configured networks: the proxies whose X-Forwarded-For is believed
(TRUSTED_PROXIES) and the scrapers let in without a token (METRICS_ALLOWED_NETWORKS). Each
setting lists addresses or networks (CIDR), IPv4 or IPv6."""

from __future__ import annotations

import ipaddress
from functools import cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@cache
def networks_parse(setting: str, specs: tuple[str, ...]) -> tuple[Network, ...]:
    """The networks of a setting (an address alone is a network of one)."""
    try:
        return tuple(ipaddress.ip_network(spec.strip(), strict=False) for spec in specs)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{setting}: {exc}") from exc


def address_in(address: str | None, setting: str) -> bool:
    """Whether `address` lies in one of the networks listed in the setting named `setting`."""
    try:
        ip = ipaddress.ip_address((address or "").strip())
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # an IPv4 client of a dual-stack listener
    return any(ip in network for network in networks_parse(setting, tuple(getattr(settings, setting))))


def proxy_trusted(address: str | None) -> bool:
    return address_in(address, "TRUSTED_PROXIES")


def forwarded_client(forwarded_for: str) -> str:
    """The client's address as the trusted proxies in front of us saw it: the right-most entry of
    X-Forwarded-For not itself a trusted proxy (each proxy appends the address it saw, so the
    entries left of the last untrusted one are whatever the client chose to send)."""
    hops = [hop.strip() for hop in forwarded_for.split(",")]
    for hop in reversed(hops):
        if not proxy_trusted(hop):
            return hop
    return hops[0]
