from django.contrib import admin

from scheduler.models import Generation


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    """Every generation request and how it ended; written by admission and the workers only."""

    list_display = (
        "request_id",
        "origin",
        "variant",
        "tier",
        "status",
        "error_code",
        "ttft_ms",
        "created_at",
    )
    list_filter = ("origin", "variant", "tier", "status")
    search_fields = ("request_id", "client_id")
    readonly_fields = [field.name for field in Generation._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False
