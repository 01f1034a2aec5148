"""System checks for the settings of client addresses.

`manage.py check` runs them, and so does every process when it starts (config/startup.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.core.exceptions import ImproperlyConfigured

from scheduler.networks import networks_parse


@register()
def trusted_proxies_check(**kwargs: Any) -> list[CheckMessage]:
    try:
        networks_parse("TRUSTED_PROXIES", tuple(settings.TRUSTED_PROXIES))
    except ImproperlyConfigured as exc:
        return [
            Error(
                str(exc),
                hint="List addresses or networks, e.g. TRUSTED_PROXIES=10.0.0.0/8,127.0.0.1.",
                id="accounts.E001",
            )
        ]
    if settings.SECURE_PROXY_SSL_HEADER and not settings.TRUSTED_PROXIES:
        return [
            Warning(
                "DJANGO_SECURE_PROXY_SSL_HEADER says a proxy is in front of the web processes, but "
                "TRUSTED_PROXIES is empty: its X-Forwarded-For is ignored, so every client shares "
                "the proxy's address, and 20 failed sign-ins from anyone lock every customer out.",
                hint="Set TRUSTED_PROXIES to the proxy's address or network (CIDR), e.g. the "
                "ingress controller's pod network.",
                id="accounts.W001",
            )
        ]
    return []
