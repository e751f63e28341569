"""`describe`: the request a gateway's authorization request describes, read once from its headers (or,
for Envoy, from the path after the endpoint's own)."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from ratelimit_app.gateway.describe import AUTH_REQUEST, AUTHORIZE, BadDescription, GatewayRequest, describe

factory = RequestFactory()


def test_caddy_and_traefik_send_x_forwarded_method_and_uri() -> None:
    request = factory.get("/ratelimit/authorize", headers={"X-Forwarded-Method": "post",
                                                           "X-Forwarded-Uri": "/orders/%C3%A9t%C3%A9?page=2"})
    assert describe(request, AUTHORIZE) == GatewayRequest("POST", "/orders/%C3%A9t%C3%A9?page=2", "/orders/été", "", 1)


def test_nginx_sends_x_original_method_and_uri_and_the_other_pair_is_not_read() -> None:
    headers = {"X-Original-Method": "DELETE", "X-Original-URI": "/carts/9", "X-Forwarded-Uri": "/reports/"}
    described = describe(factory.get("/ratelimit/auth-request", headers=headers), AUTH_REQUEST)
    assert (described.method, described.path) == ("DELETE", "/carts/9")
    with pytest.raises(BadDescription, match="send X-Forwarded-Method and X-Forwarded-Uri"):
        describe(factory.get("/ratelimit/authorize", headers=headers), AUTHORIZE)


def test_envoy_sends_the_original_method_and_path_after_the_endpoints_own() -> None:
    request = factory.generic("PATCH", "/ratelimit/authorize/orders/7?page=2",
                              headers={"X-Forwarded-Uri": "/not/read", "X-RateLimit-Service": "orders"})
    described = describe(request, AUTHORIZE, "/orders/7")
    assert described == GatewayRequest("PATCH", "/orders/7?page=2", "/orders/7", "orders", 1)


def test_an_absolute_uri_and_an_asterisk_are_request_uris() -> None:
    request = factory.get("/", headers={"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "http://shop.example/a/b?x"})
    assert describe(request, AUTHORIZE).path == "/a/b"
    request = factory.get("/", headers={"X-Forwarded-Method": "OPTIONS", "X-Forwarded-Uri": "*"})
    assert describe(request, AUTHORIZE).path == "*"


@pytest.mark.parametrize(("headers", "message"), [
    ({"X-Forwarded-Method": "GET"}, "send X-Forwarded-Method and X-Forwarded-Uri"),
    ({"X-Forwarded-Uri": "/a"}, "send X-Forwarded-Method and X-Forwarded-Uri"),
    ({"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/" + "a" * 8192}, "longer than 8192 characters"),
    ({"X-Forwarded-Method": "G E T", "X-Forwarded-Uri": "/a"}, "is not an HTTP method"),
    ({"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/a", "X-RateLimit-Cost": "1e3"}, "whole number from 1"),
    ({"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/a", "X-RateLimit-Cost": "1000000001"}, "whole number"),
    ({"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/a", "X-RateLimit-Cost": "9" * 5000}, "whole number"),
    ({"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/a", "X-RateLimit-Service": "x" * 31}, "1-30 letters"),
])
def test_what_cannot_be_read_is_a_bad_description(headers: dict[str, str], message: str) -> None:
    with pytest.raises(BadDescription, match=message):
        describe(factory.get("/ratelimit/authorize", headers=headers), AUTHORIZE)


def test_service_and_cost_are_optional_and_read_when_sent() -> None:
    base = {"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/a"}
    assert describe(factory.get("/", headers={**base, "X-RateLimit-Service": "", "X-RateLimit-Cost": ""}),
                    AUTHORIZE) == GatewayRequest("GET", "/a", "/a", "", 1)
    described = describe(factory.get("/", headers={**base, "X-RateLimit-Service": "search_v2",
                                                   "X-RateLimit-Cost": "1000000000"}), AUTHORIZE)
    assert (described.service, described.cost) == ("search_v2", 10**9)


@pytest.mark.parametrize(("uri", "path"), [
    ("//shop.example/orders?x=1", "//shop.example/orders"),  # a path that starts with "//", not a host
    ("/checkout/%2e%2e%2Fexport/x?y", "/checkout/../export/x"),  # decoded once, normalised by the shedder
    ("/a%252e/b#top", "/a%2e/b"),  # once: "%252e" is the text "%2e", as a server routes it
    ("https://shop.example//a/../b", "//a/../b"),
])
def test_the_described_path_is_the_uris_path_decoded_once(uri: str, path: str) -> None:
    request = factory.get("/", headers={"X-Forwarded-Method": "GET", "X-Forwarded-Uri": uri})
    assert describe(request, AUTHORIZE).path == path
