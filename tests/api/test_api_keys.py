"""API keys: the services, `manage.py apikey`, the console section and the Django admin."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from accounts.models import User
from admin_console.models import AuditLog
from api import keys as api_keys
from api.models import ApiKey
from scheduler.generation import Tier
from tests.admin_console.conftest import console_administrator

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> User:
    return User.objects.create(username="alice")


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(console_administrator())
    return client


# --- services -------------------------------------------------------------------------------


def test_a_key_is_stored_only_as_its_hash_with_a_visible_prefix(alice):
    issued = api_keys.api_key_create(owner=alice, name="billing sync")
    key = ApiKey.objects.get()
    assert issued.plaintext.startswith("sk-") and len(issued.plaintext) > 40
    assert key.key_hash == hashlib.sha256(issued.plaintext.encode()).hexdigest()
    assert issued.plaintext not in {key.key_hash, key.prefix, key.name}
    assert issued.plaintext.startswith(key.prefix) and len(key.prefix) == 11
    assert api_keys.api_key_authenticate(plaintext=issued.plaintext) == key
    assert ApiKey.objects.get().last_used_at is not None


def test_revoked_keys_and_keys_of_disabled_accounts_no_longer_authenticate(alice):
    revoked = api_keys.api_key_create(owner=alice)
    assert api_keys.api_key_revoke(api_key=revoked.api_key) is True
    assert api_keys.api_key_revoke(api_key=revoked.api_key) is False
    with pytest.raises(api_keys.ApiKeyInvalid, match="revoked"):
        api_keys.api_key_authenticate(plaintext=revoked.plaintext)
    active = api_keys.api_key_create(owner=alice)
    User.objects.filter(pk=alice.pk).update(is_active=False)
    with pytest.raises(api_keys.ApiKeyInvalid, match="disabled"):
        api_keys.api_key_authenticate(plaintext=active.plaintext)
    with pytest.raises(api_keys.ApiKeyInvalid):
        api_keys.api_key_authenticate(plaintext=active.plaintext[:-1] + "x")


def test_a_key_takes_its_owner_s_tier_unless_it_has_its_own(alice):
    follows = api_keys.api_key_create(owner=alice).api_key
    vip = api_keys.api_key_create(owner=alice, tier="vip").api_key
    assert (follows.effective_tier, vip.effective_tier) == ("normal", "vip")
    alice.tier = Tier.VIP
    assert follows.effective_tier == "vip"
    with pytest.raises(ValueError):
        api_keys.api_key_create(owner=alice, tier="batch")


# --- manage.py apikey -----------------------------------------------------------------------


def _apikey(*args: str) -> str:
    out = StringIO()
    call_command("apikey", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_the_command_creates_lists_and_revokes_keys(alice):
    plaintext = _apikey("create", "--user", "alice", "--tier", "vip", "--name", "etl").strip()
    key = api_keys.api_key_authenticate(plaintext=plaintext)
    assert (key.owner, key.tier, key.name) == (alice, "vip", "etl")
    listing = _apikey("list")
    assert key.prefix in listing and "etl" in listing and "active" in listing
    assert plaintext not in listing
    assert "Revoked" in _apikey("revoke", key.prefix)
    assert "already revoked" in _apikey("revoke", key.prefix)
    with pytest.raises(api_keys.ApiKeyInvalid):
        api_keys.api_key_authenticate(plaintext=plaintext)
    with pytest.raises(CommandError):
        _apikey("revoke", "sk-nothing")
    assert _audited() == [
        ("manage.py apikey", "api_key.revoke", key.prefix),
        ("manage.py apikey", "api_key.create", key.prefix),
    ]


def test_the_command_sets_a_key_s_limits_audited(alice):
    key = api_keys.api_key_create(owner=alice).api_key
    assert "2 requests and unlimited tokens" in _apikey("limits", key.prefix, "--requests-per-minute", "2")
    key.refresh_from_db()
    assert (key.requests_per_minute, key.tokens_per_minute) == (2, None)
    with pytest.raises(CommandError):
        _apikey("limits", key.prefix, "--tokens-per-minute", "0")
    assert _audited() == [("manage.py apikey", "api_key.limits", key.prefix)]


def _audited() -> list[tuple[str, str, str]]:
    """(who, what, which key) of the audit log, newest first."""
    return list(AuditLog.objects.values_list("actor_name", "action", "target"))
    with pytest.raises(CommandError):
        _apikey("create", "--user", "nobody")


# --- console ----------------------------------------------------------------------------------


def test_staff_create_a_key_in_the_console_and_see_it_only_once(staff, alice):
    response = staff.post(
        "/console/api-keys/create",
        {"owner": "alice", "name": "crm", "tier": ""},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 201
    key = ApiKey.objects.get()
    plaintext = response.context["issued"].plaintext
    assert plaintext in response.text
    assert api_keys.api_key_authenticate(plaintext=plaintext) == key
    page = staff.get("/console/api-keys")
    assert page.status_code == 200
    assert key.prefix in page.text and plaintext not in page.text
    assert "console-nav" in page.text  # the whole console page, not only the section
    assert "no-store" in response["Cache-Control"]
    assert _audited() == [("sam", "api_key.create", key.prefix)]
    assert AuditLog.objects.get().after == {
        "owner": "alice",
        "name": "crm",
        "tier": "owner's",
        "revoked": False,
    }


def test_the_console_refuses_an_unknown_owner_and_revokes_keys(staff, alice):
    response = staff.post("/console/api-keys/create", {"owner": "nobody"}, headers={"HX-Request": "true"})
    assert response.status_code == 400
    assert "no account" in response.text
    assert not ApiKey.objects.exists()
    issued = api_keys.api_key_create(owner=alice)
    response = staff.post(f"/console/api-keys/{issued.api_key.pk}/revoke", headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert "Revoked" in response.text
    with pytest.raises(api_keys.ApiKeyInvalid):
        api_keys.api_key_authenticate(plaintext=issued.plaintext)
    assert _audited() == [("sam", "api_key.revoke", issued.api_key.prefix)]


def test_the_console_s_key_pages_are_for_staff_only(alice):
    client = Client()
    client.force_login(alice)
    assert client.get("/console/api-keys").status_code == 403
    assert client.post("/console/api-keys/create", {"owner": "alice"}).status_code == 403
    assert not ApiKey.objects.exists()


# --- Django admin -----------------------------------------------------------------------------


def test_the_django_admin_lists_keys_without_secrets_and_revokes_them(alice):
    admin = Client()
    admin.force_login(User.objects.create(username="root", is_staff=True, is_superuser=True))
    issued = api_keys.api_key_create(owner=alice, name="warehouse")
    listing = admin.get("/admin/api/apikey/")
    assert listing.status_code == 200
    assert issued.api_key.prefix in listing.text
    assert issued.api_key.key_hash not in listing.text
    response = admin.post(
        "/admin/api/apikey/", {"action": "revoke", "_selected_action": [issued.api_key.pk]}, follow=True
    )
    assert "Revoked 1 key" in response.text
    with pytest.raises(api_keys.ApiKeyInvalid):
        api_keys.api_key_authenticate(plaintext=issued.plaintext)
    assert _audited() == [("root", "api_key.revoke", issued.api_key.prefix)]
