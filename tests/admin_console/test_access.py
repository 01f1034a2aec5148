"""Console powers (admin_console/access.py): staff read the console; each kind of action needs
its own permission."""

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from accounts.models import User
from api.models import ApiKey
from scheduler.models import TierPolicy

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("tier_policies")]

# Every console action: (URL name, its arguments, the permission it needs).
ACTIONS = [
    ("console:worker_drain", ["worker-1"], "manage_workers"),
    ("console:warm_spares", [], "manage_workers"),
    ("console:limit_update", ["normal"], "manage_limits"),
    ("console:source_weights_update", [], "manage_limits"),
    ("console:variant_create", [], "manage_variants"),
    ("console:variant_update", ["stable"], "manage_variants"),
    ("console:canary_start", [], "manage_variants"),
    ("console:canary_split", [], "manage_variants"),
    ("console:canary_promote", [], "manage_variants"),
    ("console:canary_rollback", [], "manage_variants"),
    ("console:canary_quality_start", [], "manage_variants"),
    ("console:experiment_start", [], "manage_variants"),
    ("console:experiment_end", [], "manage_variants"),
    ("console:api_key_create", [], "manage_api_keys"),
    ("console:api_key_revoke", [1], "manage_api_keys"),
    ("console:api_key_limits", [1], "manage_api_keys"),
    ("console:answer_pin", [], "manage_help_center"),
    ("console:answer_unpin", [1], "manage_help_center"),
    ("console:article_create", [], "manage_help_center"),
    ("console:article_edit", [1], "manage_help_center"),
    ("console:article_retire", [1], "manage_help_center"),
    ("console:article_restore", [1], "manage_help_center"),
]


def _staff(*permissions: str) -> Client:
    user = User.objects.create_user("kim", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="admin_console", codename__in=permissions)
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.security
@pytest.mark.parametrize(("name", "args", "permission"), ACTIONS)
def test_staff_without_the_power_of_an_action_are_refused_it(name, args, permission):
    others = [codename for _, _, codename in ACTIONS if codename != permission]
    kim = _staff(*others)  # every power but this one
    assert kim.get(reverse("console:dashboard")).status_code == 200  # reading the console is fine
    refused = kim.post(reverse(name, args=args), {"name": "warehouse", "spares": 3, "percent": 50})
    assert refused.status_code == 403
    assert f"admin_console.{permission}" in refused.content.decode()


@pytest.mark.security
def test_staff_without_powers_issue_no_vip_key_and_change_no_limit():
    kim = _staff()
    customer = User.objects.create_user("alice", password="pw")
    before = TierPolicy.objects.get(tier="normal").max_concurrent_per_user
    kim.post(reverse("console:api_key_create"), {"owner": customer.username, "name": "mine", "tier": "vip"})
    kim.post(reverse("console:limit_update", args=["normal"]), {"max_concurrent_per_user": 999})
    assert not ApiKey.objects.exists()
    assert TierPolicy.objects.get(tier="normal").max_concurrent_per_user == before
