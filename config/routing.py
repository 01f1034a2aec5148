"""The product's ASGI application: HTTP (with static files) through Django, but for the chat's
answer streams, which Channels serves (chat/consumers.py); the console's live socket through
Channels, for signed-in staff on this site's own pages. `config.asgi` serves it after the
start-up checks; tests drive it directly."""

from django.core.asgi import get_asgi_application
from django.urls import re_path

django_asgi_app = get_asgi_application()

# Imported once Django is set up: they reach models and settings.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from admin_console.routing import websocket_urlpatterns  # noqa: E402
from chat.routing import http_urlpatterns  # noqa: E402
from config.middleware import SyncViewGate, SyncViewHandler  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(
            URLRouter([*http_urlpatterns, re_path(r"", SyncViewGate(django_asgi_app, SyncViewHandler()))])
        ),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
