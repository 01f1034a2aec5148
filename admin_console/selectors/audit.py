"""Reads of the audit log page."""

from __future__ import annotations

from django.db.models import QuerySet

from admin_console.models import AuditLog


def audit_entries(*, limit: int = 200) -> QuerySet[AuditLog]:
    return AuditLog.objects.select_related("actor")[:limit]
