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


class Command(ChannelsRunWorker):
    help = "Run the inference worker: `runworker inference`."
    worker_class = InferenceServer
    # Run below, with the checks that read the database (the tier policies in force).
    requires_system_checks = []

    def handle(self, *args, **options) -> None:
        system_checks_enforce()
        try:
            super().handle(*args, **options)
        except EngineDeadError as exc:
            raise CommandError(f"The inference engine died: {exc}. Jobs were handed back.") from exc
