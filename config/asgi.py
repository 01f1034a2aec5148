"""ASGI entry point for daphne: the start-up checks, then the application of `config.routing`."""

import os

import django

from config.startup import system_checks_enforce

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)
# daphne, unlike runserver, runs no system checks of its own.
system_checks_enforce()

from config.routing import application  # noqa: E402

__all__ = ["application"]
