"""Every long-running process (web, inference worker, Celery) runs Django's system checks when
it starts, as `manage.py runserver` does, and refuses to start on an error: settings that
cannot work stop the process with a sentence on what to change, instead of traffic that waits
for ever. Warnings are printed and the process starts.
"""

import sys

from django.core.management.base import BaseCommand, SystemCheckError


def system_checks_enforce() -> None:
    """Run every check, including those reading the database; exit with status 1 on an error."""
    try:
        # The command's check() prints the messages exactly as `manage.py check` does.
        BaseCommand().check(databases=["default"])
    except SystemCheckError as exc:
        sys.stderr.write(f"{exc}\n")
        sys.stderr.flush()
        raise SystemExit(1) from None
