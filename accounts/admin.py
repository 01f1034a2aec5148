from django.contrib import admin
from django.contrib.auth.admin import UserAdmin

from accounts.models import User


@admin.register(User)
class TierUserAdmin(UserAdmin):
    list_display = ("username", "tier", "is_staff", "is_active")
    list_filter = ("tier", "is_staff")
    fieldsets = (*UserAdmin.fieldsets, ("Service tier", {"fields": ("tier",)}))
