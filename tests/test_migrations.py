"""The migrations describe the models as they are."""

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_the_models_and_their_migrations_agree():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
