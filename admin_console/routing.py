"""The console's WebSocket routes, mounted by config/routing.py."""

from django.urls import path

from admin_console.consumers import LiveDashboardConsumer

websocket_urlpatterns = [
    path("console/live/socket", LiveDashboardConsumer.as_asgi()),
]
