from django.apps import AppConfig


class AdminConsoleConfig(AppConfig):
    name = "admin_console"
