"""Client identity: API key headers, the client IP behind trusted proxies only, IPv6 grouped by prefix."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import RequestFactory

from ratelimit_app.apply.identity import (
    PresentedKey,
    api_key_from_request,
    client_ip,
    ip_identity,
    key_identity,
    offers_credential,
    request_ip_identity,
    user_identity,
)

rf = RequestFactory()


def request(remote: str = "203.0.113.7", xff: str | None = None, **meta: Any) -> Any:
    extra = {"REMOTE_ADDR": remote, **meta}
    if xff is not None:
        extra["HTTP_X_FORWARDED_FOR"] = xff
    return rf.get("/api/users", **extra)


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


ONE = "AbCd1234." + "a" * 43  # the shape of our keys: an 8-character prefix, a dot, the secret
TWO = "EfGh5678." + "b" * 43
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"


def test_api_key_from_x_api_key_or_bearer() -> None:
    assert api_key_from_request(request(HTTP_X_API_KEY=ONE)) == PresentedKey("AbCd1234", ONE)
    assert api_key_from_request(request(HTTP_AUTHORIZATION=f"Bearer {ONE}")) == PresentedKey("AbCd1234", ONE)
    assert api_key_from_request(request(HTTP_AUTHORIZATION=f"bearer   {ONE} ")) == PresentedKey("AbCd1234", ONE)
    assert api_key_from_request(request()) is None
    # X-API-Key wins over Authorization when both carry one of ours.
    assert api_key_from_request(request(HTTP_X_API_KEY=ONE, HTTP_AUTHORIZATION=f"Bearer {TWO}")) == \
        PresentedKey("AbCd1234", ONE)


@pytest.mark.parametrize("credentials", [
    {"HTTP_AUTHORIZATION": f"Bearer {JWT}"},  # a JWT
    {"HTTP_AUTHORIZATION": "Bearer ya29.a0AfH6SMBx"},  # an OAuth access token
    {"HTTP_AUTHORIZATION": "Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"},  # DRF's TokenAuthentication
    {"HTTP_AUTHORIZATION": "Basic dXNlcjpwdw=="},
    {"HTTP_AUTHORIZATION": f"Token {ONE}"},  # our key's shape, under another scheme: not sent to us
    {"HTTP_X_API_KEY": "team-key-4d2c91"},  # a key of the project's own in X-API-Key
    {"HTTP_X_API_KEY": "AbCd1234.x"},  # a prefix and a secret too short to be ours
    {"HTTP_X_API_KEY": ONE + "a" * 100},  # longer than any key of ours
])
def test_a_credential_of_another_format_is_not_ours(credentials: dict[str, str]) -> None:
    assert api_key_from_request(request(**credentials)) is None


def test_a_key_of_ours_in_bearer_is_read_beside_a_value_not_ours_in_x_api_key() -> None:
    assert api_key_from_request(request(HTTP_X_API_KEY="team-key", HTTP_AUTHORIZATION=f"Bearer {ONE}")) == \
        PresentedKey("AbCd1234", ONE)


def test_what_offers_a_credential() -> None:
    assert offers_credential(request(HTTP_X_API_KEY="team-key"))
    assert offers_credential(request(HTTP_AUTHORIZATION=f"Bearer {JWT}"))
    assert not offers_credential(request(HTTP_AUTHORIZATION="Token abc"))
    assert not offers_credential(request())


def test_api_key_header_is_configurable(settings: Any) -> None:
    use(settings, API_KEY_HEADER="X-Client-Token")
    assert api_key_from_request(request(HTTP_X_CLIENT_TOKEN=ONE)) == PresentedKey("AbCd1234", ONE)
    assert api_key_from_request(request(HTTP_X_API_KEY=ONE)) is None
    assert offers_credential(request(HTTP_X_CLIENT_TOKEN="x")) and not offers_credential(request(HTTP_X_API_KEY="x"))


def test_without_trusted_proxies_forwarded_for_is_ignored() -> None:
    assert client_ip(request("203.0.113.7", xff="198.51.100.1")) == "203.0.113.7"
    assert client_ip(request("203.0.113.7", xff="garbage, 1.2.3.4")) == "203.0.113.7"


def test_hop_count_reads_forwarded_for_from_the_right(settings: Any) -> None:
    use(settings, TRUSTED_PROXIES=1)
    # The client sent a spoofed entry; our one proxy appended what it saw.
    assert client_ip(request("10.0.0.2", xff="6.6.6.6, 198.51.100.1")) == "198.51.100.1"
    assert client_ip(request("10.0.0.2", xff="198.51.100.1")) == "198.51.100.1"
    assert client_ip(request("10.0.0.2")) == "10.0.0.2"  # no header: the proxy itself
    use(settings, TRUSTED_PROXIES=2)
    assert client_ip(request("10.0.0.3", xff="6.6.6.6, 198.51.100.1, 10.0.0.2")) == "198.51.100.1"
    assert client_ip(request("10.0.0.3", xff="198.51.100.1")) == "198.51.100.1"  # fewer entries than hops
    assert client_ip(request("10.0.0.3", xff="6.6.6.6, not-an-ip, 10.0.0.2")) == "10.0.0.3"


def test_cidr_list_skips_trusted_hops_from_the_right(settings: Any) -> None:
    use(settings, TRUSTED_PROXIES=["10.0.0.0/8", "2001:db8:ffff::/48"])
    assert client_ip(request("10.0.0.2", xff="6.6.6.6, 198.51.100.1, 10.1.1.1")) == "198.51.100.1"
    assert client_ip(request("2001:db8:ffff::1", xff="198.51.100.9")) == "198.51.100.9"
    # A direct client (not a trusted proxy) cannot choose its address with the header.
    assert client_ip(request("198.51.100.1", xff="10.0.0.5, 1.2.3.4")) == "198.51.100.1"
    # Every hop trusted: the leftmost is the best we know.
    assert client_ip(request("10.0.0.2", xff="10.0.0.9")) == "10.0.0.9"
    # A malformed entry: nothing left of it is trusted.
    assert client_ip(request("10.0.0.2", xff="1.2.3.4, junk, 10.0.0.3")) == "10.0.0.3"


def test_an_invalid_proxy_network_is_an_error_and_trusts_nothing_at_run_time(settings: Any) -> None:
    from ratelimit_app.conf.settings import read_settings

    use(settings, TRUSTED_PROXIES=["10.0.0.0/33", "192.0.2.0/24"])
    assert [error.setting for error in read_settings()[1]] == ["TRUSTED_PROXIES"]
    # the valid network is trusted, the invalid one is not (trusting fewer proxies limits more)
    assert client_ip(request("192.0.2.1", xff="198.51.100.9")) == "198.51.100.9"
    assert client_ip(request("10.0.0.2", xff="198.51.100.9")) == "10.0.0.2"


def test_ipv6_clients_are_grouped_by_prefix(settings: Any) -> None:
    assert request_ip_identity(request("2001:db8:1:2:3:4:5:6")) == "ip:2001:db8:1:2::/64"
    assert request_ip_identity(request("2001:db8:1:2:ffff::1")) == "ip:2001:db8:1:2::/64"
    assert request_ip_identity(request("2001:db8:1:3::1")) == "ip:2001:db8:1:3::/64"
    use(settings, IPV6_PREFIX=48)
    assert request_ip_identity(request("2001:db8:1:3::1")) == "ip:2001:db8:1::/48"


def test_ipv4_identities_and_mapped_addresses() -> None:
    assert request_ip_identity(request("203.0.113.7")) == "ip:203.0.113.7"
    assert request_ip_identity(request("::ffff:203.0.113.7")) == "ip:203.0.113.7"
    assert ip_identity("not an ip") == "ip:unknown"
    assert request_ip_identity(request("")) == "ip:unknown"


def test_identity_strings() -> None:
    assert key_identity("AbCd1234") == "key:AbCd1234"
    assert user_identity(42) == "user:42"


@pytest.mark.parametrize("proxies", [1, ["10.0.0.0/8"]])
def test_forwarded_for_entries_with_a_port_name_the_client(settings: Any, proxies: Any) -> None:
    use(settings, TRUSTED_PROXIES=proxies)
    assert client_ip(request("10.0.0.2", xff="198.51.100.1:5678")) == "198.51.100.1"
    assert client_ip(request("10.0.0.2", xff="[2001:db8::1]:443")) == "2001:db8::1"
    assert client_ip(request("10.0.0.2", xff="[2001:db8::1]")) == "2001:db8::1"
    assert client_ip(request("10.0.0.2", xff="2001:db8::1")) == "2001:db8::1"  # no port: colons are the address
    assert client_ip(request("10.0.0.2", xff="[::ffff:198.51.100.1]:80")) == "198.51.100.1"


@pytest.mark.parametrize("entry", ["198.51.100.1:", "198.51.100.1:port", "198.51.100.1:99999", "[2001:db8::1]x",
                                   "[2001:db8::1]:", "[198.51.100.1]:80", "2001:db8::1:80:"])
def test_a_malformed_port_is_not_an_address(settings: Any, entry: str) -> None:
    use(settings, TRUSTED_PROXIES=1)
    assert client_ip(request("10.0.0.2", xff=entry)) == "10.0.0.2"  # unreadable: the proxy's own address


def test_a_mapped_trusted_proxy_network_is_its_ipv4_network(settings: Any) -> None:
    use(settings, TRUSTED_PROXIES=["::ffff:10.0.0.0/104"])
    assert client_ip(request("10.0.0.2", xff="198.51.100.1")) == "198.51.100.1"
