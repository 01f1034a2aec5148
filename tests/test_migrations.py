"""The migrations describe the models as they are, in one line of history per app: two branches
merged with a migration each after the same one would need a merge migration, and those tell the
project's history instead of its schema. The later branch renumbers its migration after the
other's and depends on it instead."""

from collections import defaultdict

import pytest
from django.core.management import call_command
from django.db.migrations.loader import MigrationLoader


def test_each_app_has_one_latest_migration():
    leaves: dict[str, list[str]] = defaultdict(list)
    for app_label, name in MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes():
        leaves[app_label].append(name)

    branched = {app_label: sorted(names) for app_label, names in leaves.items() if len(names) > 1}

    assert branched == {}, f"two or more latest migrations in an app, depend one on the other: {branched}"


@pytest.mark.django_db
def test_the_models_and_their_migrations_agree():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
