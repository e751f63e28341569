"""The Channels middleware: `RateLimitMiddlewareStack(inner, **options)` limits WebSocket connects,
connections held and messages with the same tiers, keys and Redis state as the HTTP API
(docs/websockets.md). Every other scope type passes through untouched."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from channels.auth import AuthMiddlewareStack

from ..conf.snapshot import request_settings
from .connection import ConnectionLimits
from .refusals import TOO_MANY_REFUSED, deny, error_frame
from .scope import TAKEN_KEY, ScopeRequest, take_key

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]

#: The scope entry a consumer reads its connection's limits from (ConnectionLimits).
SCOPE_KEY = "ratelimit"
#: The tier limits' scope a connect is charged to, and the one messages are charged to, unless given.
CONNECT_SCOPE = "websocket"
MESSAGE_SCOPE = "websocket_message"


class WebSocketRateLimitMiddleware:
    """ASGI middleware for the `websocket` scope (inside Channels' AuthMiddlewareStack): connects charged to
    `connect_scope`, messages to `message_scope`; a refused message never reaches the application, and after
    `max_refusals` of them the connection is closed with code 4429."""

    def __init__(self, inner: ASGIApp, *, connect_scope: str = CONNECT_SCOPE, message_scope: str = MESSAGE_SCOPE,
                 max_refusals: int = 10) -> None:
        if max_refusals < 1:
            raise ValueError(f"max_refusals: {max_refusals!r} must be at least 1")
        self.inner = inner
        self.connect_scope = connect_scope
        self.message_scope = message_scope
        self.max_refusals = max_refusals

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope.get("type") != "websocket":
            await self.inner(scope, receive, send)
            return
        scope = dict(scope)
        key = take_key(scope)
        if not request_settings().enabled:
            await self.inner(scope, receive, send)
            return
        first = await receive()
        if first.get("type") != "websocket.connect":  # the client left before its handshake was read
            await self.inner(scope, _replay(first, receive), send)
            return
        limits = ConnectionLimits(ScopeRequest(scope, key), connect_scope=self.connect_scope,
                                  message_scope=self.message_scope)
        refused = await limits.connect()
        if refused is not None:
            await deny(scope, send, refused)
            return
        scope[SCOPE_KEY] = limits
        try:
            await self.inner(scope, self._messages(limits, _replay(first, receive), send), send)
        finally:
            await limits.end()

    def _messages(self, limits: ConnectionLimits, receive: Receive, send: Send) -> Receive:
        """`receive`, with each refused message answered here instead of given to the application."""
        closed = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal closed
            while True:
                event = await receive()
                if event.get("type") != "websocket.receive":
                    return event
                if closed:
                    continue  # sent after we closed the connection: dropped until the server says it ended
                refused = await limits.message(limits.message_cost(event))
                if refused is None:
                    return event
                await send({"type": "websocket.send", "text": error_frame(refused)})
                if limits.refused >= self.max_refusals:
                    closed = True
                    await send({"type": "websocket.close", "code": TOO_MANY_REFUSED})

        return limited_receive


def _replay(first: dict[str, Any], receive: Receive) -> Receive:
    """`receive`, giving `first` (already read) once before the events that follow it."""
    pending = [first]

    async def replayed() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replayed


class _TakeKey:
    """Takes the API key out of the server's own scope (its query string and offered protocols), before
    AuthMiddlewareStack copies it, and hands it to the limiting middleware further in."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope.get("type") == "websocket" and TAKEN_KEY not in scope:
            key = take_key(scope)  # in place: the server logs the connection with this query string
            if key is not None:
                scope = {**scope, TAKEN_KEY: key}
        await self.inner(scope, receive, send)


def RateLimitMiddlewareStack(inner: ASGIApp, **options: Any) -> ASGIApp:
    """`inner` behind the limits (WebSocketRateLimitMiddleware with `options`) and Channels' AuthMiddlewareStack."""
    return _TakeKey(AuthMiddlewareStack(WebSocketRateLimitMiddleware(inner, **options)))
