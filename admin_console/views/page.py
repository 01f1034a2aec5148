"""What every staff page of the console shows: its nav section and the banner of an automatic
rollback.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from admin_console.selectors import canary as canary_selectors


def _render(
    request: HttpRequest, template: str, section: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    """A console page: its nav `section`, and the banner of an automatic rollback if there is one."""
    return render(
        request,
        template,
        {"section": section, "rollback_alert": canary_selectors.automatic_rollback_alert(), **context},
        status=status,
    )
