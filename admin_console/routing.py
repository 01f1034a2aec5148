"""The console's WebSocket routes, mounted by config/routing.py."""

from django.urls import path

from admin_console.consumers import LiveDashboardConsumer
from admin_console.inbox_socket import InboxConsumer

websocket_urlpatterns = [
    path("console/live/socket", LiveDashboardConsumer.as_asgi()),
    path("console/inbox/socket", InboxConsumer.as_asgi()),
]
