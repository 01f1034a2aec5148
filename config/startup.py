"""Every long-running process (web, inference worker, Celery) runs Django's system checks when
it starts, as `manage.py runserver` does, and refuses to start on an error: settings that
cannot work stop the process with a sentence on what to change, instead of traffic that waits
for ever. Warnings are printed and the process starts.

Processes that stream tokens then take what starting allocated out of the garbage collector's
reach (`startup_heap_freeze`). Web processes keep what every post reads fresh in a thread of
their own (`hot_reads_keep_fresh`).
"""

import gc
import logging
import sys
import threading
import time

from django.core.management.base import BaseCommand, SystemCheckError
from django.db import close_old_connections

logger = logging.getLogger(__name__)


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


# Twice within the second that a post accepts for the canary split, the variants and the
# knowledge base's version (scheduler.routing.CACHE_S, knowledge.index.VERSION_CHECK_S).
HOT_READS_REFRESH_S = 0.5


def _hot_reads_refresh() -> None:
    from knowledge.index import current_index
    from scheduler.routing import routing_refresh

    try:
        routing_refresh()
        current_index.refresh()
    except Exception:
        # Posts read for themselves once their copies are a second old; the next round tries again.
        logger.exception("refreshing the canary split, variants and help center index failed")
    finally:
        close_old_connections()  # a pooled connection (PostgreSQL) goes back to the pool


def hot_reads_keep_fresh() -> threading.Thread:
    """Read what every chat post needs (the canary split, the variants it routes to, the help
    center's version and index) again twice a second, in a thread of this process. A post
    accepts them at most a second old, and reading them cost the first post after a quiet second
    two queries and a Redis round trip, about 2 ms of its time to first token; an index of a
    changed help center is built here too, not in a post."""

    def keep() -> None:
        while True:
            _hot_reads_refresh()
            time.sleep(HOT_READS_REFRESH_S)

    thread = threading.Thread(target=keep, name="hot-reads", daemon=True)
    thread.start()
    return thread
