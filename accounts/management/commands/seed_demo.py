"""`python manage.py seed_demo`: the demo accounts (a normal customer, a VIP, a staff member).

Customers get the passwords the README lists. The staff account opens the console, so its
password is never a published one: it is made at random (or given with --staff-password) and
printed once, when the account is made. Accounts that exist keep their passwords.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser

from accounts.models import User
from scheduler.generation import Tier

CUSTOMERS = [
    # username, password, tier
    ("alice", "alice-demo-pass", Tier.NORMAL),
    ("victor", "victor-demo-pass", Tier.VIP),
]
STAFF_USERNAME = "sam"
# What earlier versions gave the staff account (as a superuser): replaced wherever it is found.
PUBLISHED_STAFF_PASSWORD = "sam-demo-pass"


class Command(BaseCommand):
    help = "Create the demo accounts that do not exist yet and print how to sign in."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--staff-password",
            default="",
            help=f"Password for a new {STAFF_USERNAME!r} (default: a random one, printed once).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write("Demo accounts (sign in at /accounts/login/):")
        for username, password, tier in CUSTOMERS:
            user, created = User.objects.get_or_create(username=username, defaults={"tier": tier})
            if created:
                user.set_password(password)
                user.save(update_fields=["password"])
            self.stdout.write(f"  {username:<8} / {password:<18} {tier} tier")
        self._staff(options["staff_password"])

    def _staff(self, chosen_password: str) -> None:
        staff, created = User.objects.get_or_create(username=STAFF_USERNAME)
        # Staff, never superuser: the console needs no more, and the Django admin then shows
        # only what staff were given permissions for.
        staff.is_staff, staff.is_superuser = True, False
        new_password = created or staff.check_password(PUBLISHED_STAFF_PASSWORD)
        if new_password:
            password = chosen_password or secrets.token_urlsafe(12)
            staff.set_password(password)
            note = "staff (console); this password is shown only now"
        else:
            password, note = "(unchanged)", "staff (console)"
        staff.save()
        # Every console power, through the group admin_console's migration 0011 makes for that
        # (admin_console.models.CONSOLE_ADMINISTRATORS; accounts does not import the console).
        staff.groups.add(Group.objects.get(name="Console administrators"))
        self.stdout.write(f"  {STAFF_USERNAME:<8} / {password:<18} {note}")
