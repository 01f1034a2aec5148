"""Django's admin for models whose changes the audit log keeps: they go through this app's
services, as the console's own pages do."""

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from admin_console.services import api_keys as api_keys_services
from api.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are issued in the console or with `manage.py apikey create`, where the plaintext can
    be shown once without passing through a session; here they are found and revoked."""

    list_display = ("prefix", "name", "owner", "tier", "created_at", "last_used_at", "revoked_at")
    list_filter = ("tier",)
    search_fields = ("prefix", "name", "owner__username")
    fields = ("prefix", "owner", "name", "tier", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "owner", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = sum(api_keys_services.api_key_revoke(actor=request.user, api_key=key) for key in queryset)
        self.message_user(request, f"Revoked {revoked} key(s).", messages.SUCCESS)
