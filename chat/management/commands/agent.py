"""`manage.py agent <username> [--display-name NAME] [--capacity N] [--revoke]`: make a staff
account an agent (the `chat.agent` permission: they answer customers in the console's inbox),
with the name customers see and how many conversations they take at once, or stop it being one.
Console staff are not agents until made so, here or in the Django admin."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.models import User
from chat.models import AgentProfile


class Command(BaseCommand):
    help = "Make a staff account an agent who answers customers (or, with --revoke, not)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--display-name", default=None, help="The name customers see.")
        parser.add_argument("--capacity", type=int, default=None, help="Conversations at once (1-20).")
        parser.add_argument("--revoke", action="store_true", help="Take the agent permission away.")

    def handle(
        self,
        *args: Any,
        username: str,
        display_name: str | None,
        capacity: int | None,
        revoke: bool,
        **options: Any,
    ) -> None:
        user = User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No account {username!r}.")
        permission = Permission.objects.get(codename="agent", content_type__app_label="chat")
        if revoke:
            user.user_permissions.remove(permission)
            self.stdout.write(f"{username} is no longer an agent.")
            return
        if not user.is_staff:
            raise CommandError(f"{username} is not staff: agents work in the console.")
        user.user_permissions.add(permission)
        profile, _ = AgentProfile.objects.get_or_create(user=user)
        if display_name is not None:
            profile.display_name = display_name
        if capacity is not None:
            profile.capacity = capacity
        try:
            profile.full_clean()
        except ValidationError as exc:
            raise CommandError(" ".join(exc.messages)) from exc
        profile.save()
        self.stdout.write(
            f"{username} is an agent, shown to customers as {profile.display_name or 'Support team'!r}."
        )
