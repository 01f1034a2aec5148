"""`python manage.py apikey create --user alice [--tier vip] [--name ...]`, `apikey revoke <prefix>`,
`apikey limits <prefix> [--requests-per-minute N] [--tokens-per-minute N]`, `apikey list
[--user alice]`: API keys from the command line."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.models import ACCOUNT_TIERS, User
from admin_console.services import api_keys as api_keys_services
from api import keys as api_keys
from api.models import ApiKey


class Command(BaseCommand):
    help = "Create, revoke or list API keys for the OpenAI-compatible API."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="Issue a key; it is printed this once.")
        create.add_argument("--user", required=True, help="Username of the key's owner.")
        create.add_argument("--name", default="", help="What the key is for.")
        create.add_argument(
            "--tier", default="", choices=["", *ACCOUNT_TIERS], help="Default: the owner's tier."
        )
        revoke = actions.add_parser("revoke", help="Revoke a key by the prefix `apikey list` shows.")
        revoke.add_argument("prefix")
        limits = actions.add_parser(
            "limits", help="Set a key's own limits per minute; a limit left out is unlimited."
        )
        limits.add_argument("prefix")
        limits.add_argument("--requests-per-minute", type=int, default=None)
        limits.add_argument("--tokens-per-minute", type=int, default=None, help="Prompt and completion.")
        listing = actions.add_parser("list", help="List keys (never their secret).")
        listing.add_argument("--user", help="Only this user's keys.")

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, f"_{options['action']}")(options)

    def _user(self, username: str) -> User:
        try:
            return User.objects.get(username=username)
        except User.DoesNotExist as exc:
            raise CommandError(f"There is no user {username!r}.") from exc

    def _create(self, options: dict[str, Any]) -> None:
        issued = api_keys_services.api_key_create(
            actor=None, owner=self._user(options["user"]), name=options["name"], tier=options["tier"]
        )
        key = issued.api_key
        self.stderr.write(
            f"Created {key.prefix}… for {key.owner.username} (tier {key.effective_tier}). "
            "Store it now: it cannot be shown again."
        )
        # The key alone on stdout, so that scripts can capture it.
        self.stdout.write(issued.plaintext)

    def _key(self, prefix: str) -> ApiKey:
        prefix = prefix.rstrip("…")
        try:
            return api_keys.api_key_get(prefix=prefix)
        except ApiKey.DoesNotExist as exc:
            raise CommandError(f"No key has the prefix {prefix!r}; see `manage.py apikey list`.") from exc

    def _revoke(self, options: dict[str, Any]) -> None:
        key = self._key(options["prefix"])
        if api_keys_services.api_key_revoke(actor=None, api_key=key):
            self.stdout.write(f"Revoked {key.prefix}… of {key.owner.username}.")
        else:
            self.stdout.write(f"{key.prefix}… was already revoked.")

    def _limits(self, options: dict[str, Any]) -> None:
        key = self._key(options["prefix"])
        try:
            api_keys_services.api_key_limits_set(
                actor=None,
                api_key=key,
                requests_per_minute=options["requests_per_minute"],
                tokens_per_minute=options["tokens_per_minute"],
                fair_share_weight=key.fair_share_weight,
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        rpm, tpm = key.requests_per_minute, key.tokens_per_minute
        self.stdout.write(
            f"{key.prefix}…: {rpm or 'unlimited'} requests and {tpm or 'unlimited'} tokens per minute."
        )

    def _list(self, options: dict[str, Any]) -> None:
        owner = self._user(options["user"]) if options.get("user") else None
        rows = [("prefix", "name", "owner", "tier", "created", "last used", "status")]
        for key in api_keys.api_key_list(owner=owner):
            rows.append(
                (
                    key.prefix,
                    key.name or "-",
                    key.owner.username,
                    key.effective_tier,
                    f"{key.created_at:%Y-%m-%d %H:%M}",
                    f"{key.last_used_at:%Y-%m-%d %H:%M}" if key.last_used_at else "never",
                    f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            )
