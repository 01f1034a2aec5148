"""ASGI entry point for daphne: HTTP (with static files) through Django."""

import os

from django.core.asgi import get_asgi_application

from config.startup import system_checks_enforce

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_asgi_app = get_asgi_application()
# daphne, unlike runserver, runs no system checks of its own.
system_checks_enforce()

from channels.routing import ProtocolTypeRouter  # noqa: E402  (needs Django set up first)
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

application = ProtocolTypeRouter({"http": ASGIStaticFilesHandler(django_asgi_app)})
