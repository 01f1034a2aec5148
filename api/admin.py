from django.contrib import admin
from django.http import HttpRequest

from api.models import BatchJob


@admin.register(BatchJob)
class BatchJobAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "status", "created_at", "finished_at")
    list_filter = ("status",)
    fields = ("owner", "api_key", "status", "created_at", "started_at", "finished_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs come through the API
