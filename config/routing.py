"""The product's ASGI application: HTTP (with static files) through Django; the console's live
socket through Channels, for signed-in staff on this site's own pages. `config.asgi` serves it
after the start-up checks; tests drive it directly."""

from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

# Imported once Django is set up: they reach models and settings.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from admin_console.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
