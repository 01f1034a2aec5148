"""Databases made before the account model moved from chat to accounts."""

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.recorder import MigrationRecorder

USER_TABLE_CREATED = ("chat", "0001_initial")
USER_MODEL_ADOPTED = ("accounts", "0001_initial")


def user_move_record(*, connection: BaseDatabaseWrapper) -> bool:
    """Record accounts 0001 as applied on a database whose chat 0001 made the account table, and
    say whether it had to.

    Django's admin, like every app with a foreign key to the account model, depends on the first
    migration of AUTH_USER_MODEL's app. A database that applied them while that app was chat has
    them applied before accounts 0001, and `migrate` refuses such a history before running
    anything. Accounts 0001 only takes over chat 0001's table, so recording it is all that
    applying it would do."""
    recorder = MigrationRecorder(connection)
    if not recorder.has_table():
        return False
    applied = recorder.applied_migrations()
    if USER_TABLE_CREATED not in applied or USER_MODEL_ADOPTED in applied:
        return False
    recorder.record_applied(*USER_MODEL_ADOPTED)
    return True
