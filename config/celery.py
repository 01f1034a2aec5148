"""The Celery app: periodic work (retention, later canary evaluation) and submit-then-poll jobs."""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.import_modules.connect(sender=app)
def _system_checks_enforce(**kwargs: object) -> None:
    """Celery runs Django's checks but ignores what they find: refuse to start on an error.
    Worker and beat both import the task modules first thing, before beat opens its schedule."""
    from config.startup import system_checks_enforce

    system_checks_enforce()
