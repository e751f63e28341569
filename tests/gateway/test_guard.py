"""The gateway endpoint answers gateways only (ratelimit_app.gateway.guard): a call that fails a guard of
RATELIMIT['GATEWAY_SECRET'] / RATELIMIT['GATEWAY_NETWORKS'] is refused with a 403 JSON body and charges
and holds nothing; `check` reports an endpoint routed with neither guard, and never shows the secret."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client

from ratelimit_app.gateway.checks import check_gateway_guard
from tests.gateway.test_views import CLIENT, auth_request, forward_auth, release, use
from tests.support.limits_support import add_slots, make_key, parse_ietf, seed_tiers

pytestmark = pytest.mark.django_db

SECRET = "s3cret-of-the-gateways-0123456789"
OUTSIDER = "198.51.100.9"


@pytest.fixture(autouse=True)
def _behind_one_gateway(settings: Any) -> None:
    use(settings, TRUSTED_PROXIES=1)


def _remaining(client: Client, key: str) -> tuple[int, int]:
    """(free slots, burst units left) of `key`, read by a gateway's call that is released at once."""
    answer = forward_auth(client, key)
    assert answer.status_code == 200, answer.content
    assert release(client, answer) == 204
    state = parse_ietf(answer.headers["RateLimit"])
    return state["concurrency"]["r"], state["burst"]["r"]


def test_a_call_from_outside_the_gateway_networks_is_refused_and_charges_and_holds_nothing(client: Client) -> None:
    seed_tiers()
    add_slots("free", 2)
    key = make_key("free")
    before = _remaining(client, key)  # from 127.0.0.1, the demo's GATEWAY_NETWORKS
    for _ in range(12):  # more than the key's slots and burst: had one counted, the next call would show it
        outside = Answer(client.get("/ratelimit/authorize", REMOTE_ADDR=OUTSIDER, headers={
            "X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/checkout", "X-Forwarded-For": CLIENT,
            "X-API-Key": key, "X-RateLimit-Cost": "5"}))
        assert outside.status_code == 403 and outside.headers["Content-Type"] == "application/json"
        assert outside.json()["error"] == "forbidden" and "GATEWAY_NETWORKS" in outside.json()["detail"]
        assert "X-RateLimit-Lease" not in outside.headers and "RateLimit" not in outside.headers
    # a forwarded address of the gateway's own does not help: the direct peer is what counts
    spoofed = client.get("/ratelimit/authorize", REMOTE_ADDR=OUTSIDER, headers={
        "X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/", "X-Forwarded-For": "127.0.0.1", "X-API-Key": key})
    assert spoofed.status_code == 403
    after = _remaining(client, key)
    assert after == (before[0], before[1] - 1)  # only the second reading's own unit


def test_nginx_gets_the_refusal_as_a_403_carrying_it(client: Client) -> None:
    refused = client.get("/ratelimit/auth-request", REMOTE_ADDR=OUTSIDER,
                         headers={"X-Original-Method": "GET", "X-Original-URI": "/"})
    assert refused.status_code == 403 and refused.headers["X-RateLimit-Status"] == "403"
    assert json.loads(refused.headers["X-RateLimit-Body"])["error"] == "forbidden"


def test_with_a_secret_only_calls_carrying_it_pass(client: Client, settings: Any, caplog: Any) -> None:
    use(settings, GATEWAY_SECRET=SECRET, GATEWAY_NETWORKS=[])
    seed_tiers()
    key = make_key("free")
    caplog.set_level(logging.DEBUG, logger="ratelimit_app")
    for headers in ({}, {"X-RateLimit-Gateway-Secret": SECRET[:-1]}, {"X-RateLimit-Gateway-Secret": SECRET + "x"}):
        answer = forward_auth(client, key, **headers)
        assert answer.status_code == 403 and "X-RateLimit-Gateway-Secret" in answer.json()["detail"]
    assert forward_auth(client, key, **{"X-RateLimit-Gateway-Secret": SECRET}).status_code == 200
    assert auth_request(client, key, **{"X-RateLimit-Gateway-Secret": SECRET}).status_code == 200
    # the secret from any address: no network is set
    assert Answer(client.get("/ratelimit/authorize", REMOTE_ADDR=OUTSIDER, headers={
        "X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/", "X-API-Key": key,
        "X-RateLimit-Gateway-Secret": SECRET})).status_code == 200
    assert SECRET not in caplog.text and SECRET[:-1] not in caplog.text


def test_with_both_guards_a_call_must_pass_both(client: Client, settings: Any) -> None:
    use(settings, GATEWAY_SECRET=SECRET, GATEWAY_NETWORKS=["127.0.0.1"])
    seed_tiers()
    key = make_key("free")
    assert forward_auth(client, key).status_code == 403  # the right network, no secret
    outside = client.get("/ratelimit/authorize", REMOTE_ADDR=OUTSIDER, headers={
        "X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/", "X-API-Key": key, "X-RateLimit-Gateway-Secret": SECRET})
    assert outside.status_code == 403  # the secret, from elsewhere
    assert forward_auth(client, key, **{"X-RateLimit-Gateway-Secret": SECRET}).status_code == 200


def test_release_is_guarded_the_same_way(client: Client, settings: Any) -> None:
    seed_tiers()
    add_slots("free", 1)
    key = make_key("free")
    taken = forward_auth(client, key)
    lease = taken.headers["X-RateLimit-Lease"]
    outside = client.post("/ratelimit/release", REMOTE_ADDR=OUTSIDER, headers={"X-RateLimit-Lease": lease})
    assert outside.status_code == 403 and json.loads(outside.content)["error"] == "forbidden"
    assert forward_auth(client, key).status_code == 429  # the slot is still held
    assert client.post("/ratelimit/release", headers={"X-RateLimit-Lease": lease}).status_code == 204
    assert forward_auth(client, key).status_code == 200


def test_with_neither_guard_every_call_is_refused_and_check_says_so(client: Client, settings: Any) -> None:
    use(settings, GATEWAY_NETWORKS=[], GATEWAY_SECRET=None)
    answer = forward_auth(client, "anything")
    assert answer.status_code == 403 and "neither RATELIMIT['GATEWAY_SECRET']" in answer.json()["detail"]
    assert client.post("/ratelimit/release").status_code == 403
    [error] = check_gateway_guard()
    assert error.id == "ratelimit.E006" and "/ratelimit/authorize" in error.msg
    use(settings, GATEWAY_SECRET=SECRET)
    assert check_gateway_guard() == []


def test_an_invalid_secret_is_reported_never_shown_and_refuses_every_call(client: Client, settings: Any,
                                                                        caplog: Any) -> None:
    weak = "short secret"
    use(settings, GATEWAY_SECRET=weak)
    caplog.set_level(logging.DEBUG, logger="ratelimit_app")
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    assert "RATELIMIT['GATEWAY_SECRET'] is invalid" in str(raised.value) and weak not in str(raised.value)
    answer = forward_auth(client, "anything", **{"X-RateLimit-Gateway-Secret": weak})
    assert answer.status_code == 403 and "GATEWAY_SECRET" in answer.json()["detail"]
    assert weak not in answer.content.decode() and weak not in caplog.text


def test_networks_wider_than_a_slash_8_are_refused(settings: Any) -> None:
    use(settings, GATEWAY_NETWORKS=["0.0.0.0/0"])
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    assert "RATELIMIT['GATEWAY_NETWORKS'] is ['0.0.0.0/0']" in str(raised.value)


class Answer:
    def __init__(self, response: Any) -> None:
        self.status_code, self.headers, self.content = response.status_code, response.headers, response.content

    def json(self) -> Any:
        return json.loads(self.content)
