"""The audit log page, staff only: parse, check access, call one service or selector, render."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from admin_console.access import staff_required
from admin_console.selectors import audit as audit_selectors
from admin_console.views.page import _render


@require_GET
@staff_required
def audit_log(request: HttpRequest) -> HttpResponse:
    return _render(request, "admin_console/audit.html", "audit", {"entries": audit_selectors.audit_entries()})
