"""Who a WebSocket is: the key from the query string or the offered protocols (taken out of the scope), the
headers, the client address and the user as the planning reads them."""

from __future__ import annotations

from typing import Any

from ratelimit_app.apply.identity import api_key_from_request, request_ip_identity
from ratelimit_app.channels.scope import TAKEN_KEY, ScopeRequest, take_key

KEY = "AbCd1234." + "s" * 43


def scope_of(**entries: Any) -> dict[str, Any]:
    return {"type": "websocket", "path": "/ws/echo/", "query_string": b"", "headers": [], "subprotocols": [],
            "client": ("203.0.113.7", 5000), "server": ("127.0.0.1", 8000), **entries}


def test_a_key_in_the_query_string_is_taken_out_of_it() -> None:
    scope = scope_of(query_string=f"room=1&key={KEY}&x=".encode())
    assert take_key(scope) == KEY
    assert scope["query_string"] == b"room=1&x="


def test_a_key_among_the_offered_protocols_is_taken_out_of_them_and_of_the_header() -> None:
    scope = scope_of(subprotocols=["chat", KEY],
                     headers=[(b"sec-websocket-protocol", f"chat, {KEY}".encode()), (b"origin", b"https://a.b")])
    assert take_key(scope) == KEY
    assert scope["subprotocols"] == ["chat"]
    assert scope["headers"] == [(b"sec-websocket-protocol", b"chat"), (b"origin", b"https://a.b")]


def test_a_value_not_shaped_like_our_keys_is_left_alone() -> None:
    scope = scope_of(query_string=b"key=someone-elses-token", subprotocols=["graphql-ws"])
    assert take_key(scope) is None
    assert scope["query_string"] == b"key=someone-elses-token" and scope["subprotocols"] == ["graphql-ws"]


def test_a_key_taken_by_an_outer_middleware_is_handed_over_once() -> None:
    scope = scope_of(**{TAKEN_KEY: KEY})
    assert take_key(scope) == KEY and TAKEN_KEY not in scope


def test_the_request_carries_the_key_the_address_and_the_headers() -> None:
    scope = scope_of(headers=[(b"user-agent", b"test"), (b"x-forwarded-for", b"198.51.100.1")])
    request = ScopeRequest(scope, KEY)
    assert api_key_from_request(request) == (KEY[:8], KEY)
    assert request_ip_identity(request) == "ip:203.0.113.7"  # no trusted proxies: the header is not believed
    assert request.META["HTTP_USER_AGENT"] == "test" and request.path == "/ws/echo/"


def test_a_header_key_of_ours_wins_and_a_user_is_read_from_the_scope() -> None:
    other = "ZyXw9876." + "t" * 43
    user = object()
    request = ScopeRequest(scope_of(headers=[(b"x-api-key", other.encode())], user=user), KEY)
    assert api_key_from_request(request) == (other[:8], other)
    assert request.user is user
