"""Who is on the other end of a WebSocket: the request the limiter plans a connect as, built from a Channels
scope, and the API key taken out of its query string or offered protocols, in the server's own scope too
(its log line prints that query string), so that no consumer, log or echo shows it (docs/websockets.md)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.http import HttpRequest

from ..apply.identity import identity_config
from ..core.apikeys import parse_key

#: The query string parameter a browser passes its API key in.
QUERY_PARAMETER = "key"
#: Where `take_key` leaves a key it took for the limiting middleware further in (which removes it).
TAKEN_KEY = "ratelimit.taken_key"


def _decoded(value: bytes) -> str:
    return value.decode("latin-1")


def take_key(scope: dict[str, Any]) -> str | None:
    """The API key of ours the connection offers in its query string or its protocols, removed from both
    (in `scope` itself); None when it offers none. A value without our keys' shape is left where it is.
    A key an outer middleware already took (`TAKEN_KEY`) is returned and removed from `scope`."""
    if TAKEN_KEY in scope:
        return str(scope.pop(TAKEN_KEY))
    key = None
    query = _decoded(scope.get("query_string") or b"")
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        ours = [value for name, value in pairs if name == QUERY_PARAMETER and parse_key(value) is not None]
        if ours:
            key = ours[0]
            kept = [(name, value) for name, value in pairs if not (name == QUERY_PARAMETER and value in ours)]
            scope["query_string"] = urlencode(kept).encode("latin-1")
    protocols = list(scope.get("subprotocols") or ())
    offered = [protocol for protocol in protocols if parse_key(protocol) is not None]
    if offered:
        key = key or offered[0]
        scope["subprotocols"] = [protocol for protocol in protocols if protocol not in offered]
        scope["headers"] = [_without(name, value, offered) for name, value in scope.get("headers") or ()]
    return key


def _without(name: bytes, value: bytes, offered: list[str]) -> tuple[bytes, bytes]:
    """A header of the handshake, the keys in `offered` taken out of Sec-WebSocket-Protocol."""
    if name.lower() != b"sec-websocket-protocol":
        return name, value
    kept = [item.strip() for item in _decoded(value).split(",") if item.strip() not in offered]
    return name, ", ".join(kept).encode("latin-1")


class ScopeRequest(HttpRequest):
    """The request the limiter plans a connect of a WebSocket `scope` as: its path, its headers (as
    request.META), its client address (REMOTE_ADDR), its user (scope["user"], set by Channels'
    AuthMiddlewareStack) and `key` (from `take_key`) as the API key header, unless a header already
    carries a key of ours."""

    def __init__(self, scope: dict[str, Any], key: str | None) -> None:
        super().__init__()
        path = str(scope.get("path") or "/")
        self.path = self.path_info = path
        self.method = "GET"
        meta: dict[str, Any] = self.META
        for name, value in scope.get("headers") or ():
            header = "HTTP_" + _decoded(name).upper().replace("-", "_")
            meta[header] = f"{meta[header]},{_decoded(value)}" if header in meta else _decoded(value)
        meta["PATH_INFO"] = path
        meta["QUERY_STRING"] = _decoded(scope.get("query_string") or b"")
        client = scope.get("client")
        meta["REMOTE_ADDR"] = str(client[0]) if client else ""
        server = scope.get("server")
        if server:
            meta["SERVER_NAME"], meta["SERVER_PORT"] = str(server[0]), str(server[1])
        header = identity_config().api_key_meta
        if key is not None and parse_key(meta.get(header)) is None:
            meta[header] = key
        user = scope.get("user")
        if user is not None:
            self.user = user
