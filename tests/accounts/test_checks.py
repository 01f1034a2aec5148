"""The system checks of client addresses (accounts/checks.py)."""

import pytest
from django.test import override_settings

from accounts.checks import trusted_proxies_check


@pytest.mark.security
@override_settings(SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"), TRUSTED_PROXIES=[])
def test_a_deployment_behind_a_proxy_that_trusts_none_is_warned_that_customers_share_its_address():
    [warning] = trusted_proxies_check()
    assert warning.id == "accounts.W001"


@override_settings(TRUSTED_PROXIES=["10.0.0.0/33"])
def test_a_trusted_proxy_network_that_is_not_one_is_an_error():
    [error] = trusted_proxies_check()
    assert error.id == "accounts.E001"
    assert "TRUSTED_PROXIES" in error.msg


@override_settings(
    SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"), TRUSTED_PROXIES=["10.0.0.0/8", "::1"]
)
def test_networks_and_addresses_pass():
    assert trusted_proxies_check() == []
