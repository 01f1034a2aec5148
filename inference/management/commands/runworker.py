"""`python manage.py runworker inference`: Channels' runworker, serving the `inference`
channel with the claim loop.

Jobs live in Redis Streams rather than channel messages because Channels delivers at most
once; so the worker's server starts the claim loop with the process instead of waiting for a
channel message.
"""

import asyncio
import signal

from channels.management.commands.runworker import Command as ChannelsRunWorker
from channels.worker import Worker
from django.core.management import CommandError
from django.db import connections

from config.startup import system_checks_enforce
from inference.engines.base import EngineDeadError
from inference.metrics import worker_exporter_start
from inference.worker import InferenceWorker


class InferenceServer(Worker):
    async def handle(self) -> None:
        if self.channels != ["inference"]:
            raise CommandError("This project's only worker channel is `inference`.")
        worker_exporter_start()
        worker = InferenceWorker.from_settings()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, worker.drain)
        await worker.run()

    async def application_checker(self) -> None:
        """No per-channel application instances to reap: the worker owns its tasks."""


def database_connection_keep() -> None:
    """On SQLite the worker keeps its database connection for its whole life. The web processes
    open one per request (settings: `CONN_MAX_AGE` 0, since each request has a thread of its own),
    but the worker touches the database from one thread only (`database_sync_to_async`'s), so
    one kept connection is all it ever holds; opening one for every finished answer (SQLite
    registers its functions and runs the WAL pragmas each time) took a fifth of its CPU when
    2000 answers streamed at once. PostgreSQL's pool already reuses connections, and refuses
    persistent ones."""
    database = connections.settings["default"]
    if database["ENGINE"] == "django.db.backends.sqlite3":
        database["CONN_MAX_AGE"] = None


class Command(ChannelsRunWorker):
    help = "Run the inference worker: `runworker inference`."
    worker_class = InferenceServer
    # Run below, with the checks that read the database (the tier policies in force).
    requires_system_checks = []

    def handle(self, *args, **options) -> None:
        database_connection_keep()
        system_checks_enforce()
        try:
            super().handle(*args, **options)
        except EngineDeadError as exc:
            raise CommandError(f"The inference engine died: {exc}. Jobs were handed back.") from exc
