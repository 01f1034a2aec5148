"""`python manage.py migrate`: Django's, after recording the account model's move on a database
that predates it (accounts/user_move.py), so an existing database migrates with the same
command as a new one."""

from typing import Any

from django.core.management.commands import migrate
from django.db import connections

from accounts.user_move import USER_MODEL_ADOPTED, user_move_record


class Command(migrate.Command):
    def handle(self, *args: Any, **options: Any) -> None:
        if user_move_record(connection=connections[options["database"]]) and options["verbosity"] >= 1:
            app_label, name = USER_MODEL_ADOPTED
            self.stdout.write(f"Recorded {app_label}.{name} as applied: the account table exists already.")
        super().handle(*args, **options)
