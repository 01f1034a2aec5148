"""Sign-in: throttled per username and per address, and passwords checked by Django's standard
validators."""

import pytest
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client, override_settings

from accounts.models import User

pytestmark = [
    pytest.mark.django_db,
    # A fast hasher: these tests make many attempts, each of which hashes a password.
    pytest.mark.usefixtures("_fast_hashing"),
]


@pytest.fixture
def _fast_hashing():
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", password="correct horse battery")


def _sign_in(username: str, password: str, address: str = "192.0.2.1", form: str = "/accounts/login/"):
    return Client(REMOTE_ADDR=address).post(form, {"username": username, "password": password})


def test_a_username_with_too_many_failures_is_refused_with_429_even_with_the_right_password(alice):
    for n in range(5):  # LOGIN_MAX_FAILURES_PER_USERNAME, from addresses of its own each
        assert _sign_in("alice", "guess", address=f"198.51.100.{n}").status_code == 200
    refused = _sign_in("alice", "correct horse battery", address="203.0.113.9")
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 900
    assert "Too many failed sign-in attempts. Please try again in 15 minutes." in refused.content.decode()
    assert "_auth_user_id" not in refused.wsgi_request.session
    assert _sign_in("bob", "guess", address="203.0.113.9").status_code == 200  # others still may


@override_settings(LOGIN_MAX_FAILURES_PER_ADDRESS=3)
def test_an_address_with_too_many_failures_is_refused_whatever_the_username(alice):
    for username in ("bob", "carol", "dave"):
        assert _sign_in(username, "guess", address="2001:db8::1").status_code == 200
    assert _sign_in("alice", "correct horse battery", address="2001:db8::2").status_code == 429  # same /64
    assert _sign_in("alice", "correct horse battery", address="2001:db8:1::1").status_code == 302


def test_signing_in_ends_the_usernames_count(alice):
    for _ in range(4):
        _sign_in("alice", "guess", address="198.51.100.1")
    assert _sign_in("alice", "correct horse battery", address="198.51.100.2").status_code == 302
    for _ in range(4):
        _sign_in("alice", "guess", address="198.51.100.3")
    assert _sign_in("alice", "correct horse battery", address="198.51.100.4").status_code == 302


@pytest.mark.parametrize("password", ["password", "12345678901", "alice-smith"])
def test_common_numeric_or_personal_passwords_are_refused(password):
    user = User(username="alice-smith", email="alice@example.com")
    with pytest.raises(ValidationError):
        validate_password(password, user)


@pytest.mark.security
def test_guessing_a_staff_password_at_the_admin_sign_in_is_refused_after_five_failures():
    User.objects.create_user("sam", password="correct horse battery", is_staff=True, is_superuser=True)
    for n in range(5):
        guessed = _sign_in("sam", f"guess-{n}", address=f"198.51.100.{n}", form="/admin/login/")
        assert guessed.status_code == 200
    refused = _sign_in("sam", "correct horse battery", address="203.0.113.9", form="/admin/login/")
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 900
    assert "_auth_user_id" not in refused.wsgi_request.session
    # One count for both forms: the customers' sign-in refuses the same username.
    assert _sign_in("sam", "correct horse battery", address="203.0.113.10").status_code == 429


@pytest.mark.security
def test_guesses_sent_while_a_password_is_being_checked_never_exceed_the_windows_five(alice, monkeypatch):
    """Attempts in parallel: each one sent while the first's password is being checked. Counted
    only after their check, all of them would reach it."""
    checked: list[str] = []
    check_password = ModelBackend.authenticate

    def slow_check(self, request, username=None, password=None, **kwargs):
        checked.append(password)
        if len(checked) == 1:
            for n in range(10):
                _sign_in("alice", f"parallel-{n}", address=f"198.51.100.{n + 10}")
        return check_password(self, request, username=username, password=password, **kwargs)

    monkeypatch.setattr(ModelBackend, "authenticate", slow_check)
    assert _sign_in("alice", "first", address="198.51.100.1").status_code == 200
    assert len(checked) == 5  # LOGIN_MAX_FAILURES_PER_USERNAME
    assert _sign_in("alice", "correct horse battery", address="203.0.113.9").status_code == 429


@pytest.mark.security
@override_settings(TRUSTED_PROXIES=["10.0.0.0/8"])
def test_failed_sign_ins_behind_the_ingress_network_lock_out_only_their_own_address(alice):
    """Behind a load balancer every request comes from the ingress's pods: one customer's bad
    sign-ins must not lock out every other."""
    for n in range(20):  # LOGIN_MAX_FAILURES_PER_ADDRESS, each through another ingress pod
        Client(REMOTE_ADDR=f"10.1.0.{n}", HTTP_X_FORWARDED_FOR="198.51.100.66").post(
            "/accounts/login/", {"username": f"user-{n}", "password": "guess"}
        )
    elsewhere = Client(REMOTE_ADDR="10.1.0.99", HTTP_X_FORWARDED_FOR="203.0.113.5")
    assert (
        elsewhere.post(
            "/accounts/login/", {"username": "alice", "password": "correct horse battery"}
        ).status_code
        == 302
    )
    # A cloud load balancer (10.2.0.1) in front of the ingress: its address is a proxy's too.
    chained = Client(REMOTE_ADDR="10.1.0.3", HTTP_X_FORWARDED_FOR="198.51.100.66, 10.2.0.1")
    assert chained.post("/accounts/login/", {"username": "bob", "password": "guess"}).status_code == 429
    # What a client writes in the header itself, left of what the proxies saw, counts for nothing.
    forged = Client(REMOTE_ADDR="10.1.0.3", HTTP_X_FORWARDED_FOR="203.0.113.5, 198.51.100.66")
    assert forged.post("/accounts/login/", {"username": "bob", "password": "guess"}).status_code == 429
