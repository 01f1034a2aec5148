"""Every long-running process (web, inference worker, Celery) runs Django's system checks when
it starts, as `manage.py runserver` does, and refuses to start on an error: settings that
cannot work stop the process with a sentence on what to change, instead of traffic that waits
for ever. Warnings are printed and the process starts.

Processes that stream tokens then take what starting allocated out of the garbage collector's
reach (`startup_heap_freeze`).
"""

import gc
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


# A full collection is considered after this many collections of the middle generation, not
# Python's 10. The objects of live streams (tokens in flight, each stream's request) outlive
# young collections and reach the oldest generation, so full collections kept coming while
# thousands of streams flowed, each walking all of them. Young collections keep Python's
# thresholds: a young threshold of 50,000 made each pause about 30 ms for no less work in total.
GC_FULL_COLLECTION_EVERY = 100


def startup_heap_freeze() -> None:
    """Move every object alive after start-up (Django, the apps, their libraries: most of the
    heap) out of the garbage collector's reach, and run full collections less often.

    A full collection walks every tracked object, so with the start-up heap in it one stopped
    the web process for over a second in the middle of 1000 streams. What starting allocated
    lives as long as the process: there is nothing for the collector to find in it."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, GC_FULL_COLLECTION_EVERY)
