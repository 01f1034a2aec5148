from django.contrib import admin

from chat.models import Conversation, Message


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
