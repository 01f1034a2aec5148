from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from chat.models import Conversation, Message, User


@admin.register(User)
class TierUserAdmin(UserAdmin):
    list_display = ("username", "tier", "is_staff", "is_active")
    list_filter = ("tier", "is_staff")
    fieldsets = (*UserAdmin.fieldsets, ("Service tier", {"fields": ("tier",)}))


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "content", "generation", "feedback", "created_at")
    readonly_fields = fields


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "updated_at")
    # A guest's session key signs in as that guest: it is never shown.
    exclude = ("session_key",)
    inlines = [MessageInline]
