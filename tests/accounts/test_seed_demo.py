"""`manage.py seed_demo`: demo customers with the README's passwords, and a staff account that
never has a published password or superuser rights."""

import re
from io import StringIO

import pytest
from django.core.management import call_command

from accounts.models import User

pytestmark = pytest.mark.django_db


def _seed(*args: str) -> str:
    out = StringIO()
    call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


def _printed_staff_password(output: str) -> str:
    match = re.search(r"^\s+sam\s+/ (\S+)", output, flags=re.MULTILINE)
    assert match, output
    return match.group(1)


def test_the_staff_account_gets_a_random_password_printed_once_and_no_superuser_rights():
    first = _seed()
    sam = User.objects.get(username="sam")
    password = _printed_staff_password(first)
    assert sam.is_staff and not sam.is_superuser
    assert sam.check_password(password)
    assert not sam.check_password("sam-demo-pass")
    second = _seed()
    assert password not in second
    sam.refresh_from_db()
    assert sam.check_password(password)


def test_a_staff_account_with_the_published_password_is_given_a_new_one_and_loses_superuser():
    User.objects.create_superuser("sam", password="sam-demo-pass")
    password = _printed_staff_password(_seed())
    sam = User.objects.get(username="sam")
    assert not sam.is_superuser
    assert not sam.check_password("sam-demo-pass")
    assert sam.check_password(password)


def test_existing_customers_keep_the_password_they_chose():
    _seed()
    alice = User.objects.get(username="alice")
    alice.set_password("a password alice chose")
    alice.save()
    _seed()
    alice.refresh_from_db()
    assert alice.check_password("a password alice chose")
    assert User.objects.get(username="victor").check_password("victor-demo-pass")


def test_a_chosen_staff_password_is_used_for_a_new_account():
    _seed("--staff-password", "chosen-for-this-run")
    assert User.objects.get(username="sam").check_password("chosen-for-this-run")
