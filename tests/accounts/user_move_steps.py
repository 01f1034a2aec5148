"""The two sides of the account model's move, each run in a process of its own on the database
that DATABASE_URL names (tests/accounts/test_user_move.py):

- `before`: migrate an empty database as the release before the move did (AUTH_USER_MODEL
  chat.User, its migrations up to the leaves below), then write an account, its conversation,
  its API key and a permission, with the models of that state; prints their ids.
- `after` (run after `manage.py migrate`): sign the account in and say what it owns.

The account's secrets come in as JSON on stdin; results go out as JSON on stdout.
"""

from __future__ import annotations

import hashlib
import json
import sys

import django
from django.conf import settings

# Every app's latest migration in the release before the move.
RELEASE_BEFORE_MOVE = [
    ("admin", "0003_logentry_add_action_flag_choices"),
    ("admin_console", "0009_key_limits_and_variants_audit_actions"),
    ("api", "0004_merge_key_limits_and_variants"),
    ("auth", "0012_alter_user_first_name_max_length"),
    ("chat", "0008_api_models_moved_to_api"),
    ("contenttypes", "0002_remove_content_type_name"),
    ("knowledge", "0002_answer_cache"),
    ("scheduler", "0010_merge_key_limits_and_variants"),
    ("sessions", "0001_initial"),
]


def before(secrets: dict) -> dict:
    from django.contrib.auth.hashers import make_password
    from django.core.management.sql import emit_post_migrate_signal
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    # Migration files read AUTH_USER_MODEL when they are imported, which the executor does next;
    # the apps themselves have been set up with today's model.
    settings.AUTH_USER_MODEL = "chat.User"
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(RELEASE_BEFORE_MOVE)
    assert not any(migration.app_label == "accounts" for migration, _ in plan)
    state = executor.migrate(RELEASE_BEFORE_MOVE, plan=plan)
    # What `migrate` did next: content types and permissions for the models of that release.
    emit_post_migrate_signal(0, False, connection.alias, apps=state.apps, plan=plan)

    apps = state.apps
    user = apps.get_model("chat", "User").objects.create(
        username=secrets["username"], password=make_password(secrets["password"]), tier="vip"
    )
    permissions = apps.get_model("auth", "Permission").objects
    user.user_permissions.add(permissions.get(content_type__app_label="chat", codename="change_user"))
    conversation = apps.get_model("chat", "Conversation").objects.create(owner=user)
    apps.get_model("chat", "Message").objects.create(conversation=conversation, role="user", content="Hello")
    api_key = apps.get_model("api", "ApiKey").objects.create(
        owner=user,
        prefix=secrets["api_key"][:11],
        key_hash=hashlib.sha256(secrets["api_key"].encode()).hexdigest(),
    )
    return {"user": user.pk, "conversation": str(conversation.pk), "api_key": api_key.pk}


def after(secrets: dict) -> dict:
    from django.test import Client
    from django.test.utils import setup_test_environment

    from accounts.models import User
    from api.keys import api_key_authenticate
    from chat.models import Conversation

    setup_test_environment()  # the test client's host
    signed_in = Client().post(
        "/accounts/login/", {"username": secrets["username"], "password": secrets["password"]}
    )
    user = User.objects.get(pk=signed_in.wsgi_request.session["_auth_user_id"])
    api_key = api_key_authenticate(plaintext=secrets["api_key"])
    conversations = Conversation.objects.filter(owner=user)
    return {
        "user": user.pk,
        "tier": user.tier,
        "conversations": [str(conversation.pk) for conversation in conversations],
        "messages": [message.content for message in conversations.get().messages.all()],
        "api_key": api_key.pk,
        "api_key_owner": api_key.owner_id,
        "can_change_accounts": user.has_perm("accounts.change_user"),
    }


if __name__ == "__main__":
    django.setup()
    step = {"before": before, "after": after}[sys.argv[1]]
    print(json.dumps(step(json.load(sys.stdin))))
