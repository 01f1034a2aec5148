"""ASGI entry point for daphne: the start-up checks, then the application of `config.routing`,
with what starting allocated frozen out of the garbage collector's reach, and what every post
reads kept fresh by a thread of the process."""

import os

import django

from config.startup import hot_reads_keep_fresh, startup_heap_freeze, system_checks_enforce

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)
# daphne, unlike runserver, runs no system checks of its own.
system_checks_enforce()

from config.routing import application  # noqa: E402

startup_heap_freeze()
hot_reads_keep_fresh()

__all__ = ["application"]
