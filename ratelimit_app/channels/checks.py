"""System checks of the Channels middleware in settings.ASGI_APPLICATION: W080, Channels' AuthMiddleware
runs inside the limiting middleware, or RateLimitMiddlewareStack does not take the key out of the server's
scope; W081, no tier limits the message scope. Silent when ASGI_APPLICATION is not set."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DatabaseError
from django.utils.module_loading import import_string

from .middleware import WebSocketRateLimitMiddleware, _TakeKey

#: How deep the application's wrappers are walked (a guard against a cycle of references).
_MAX_DEPTH = 20


def _children(app: Any) -> list[Any]:
    """The applications `app` wraps: a middleware's `inner`, a ProtocolTypeRouter's protocols."""
    found = [app.inner] if hasattr(app, "inner") else []
    mapping = getattr(app, "application_mapping", None)
    if isinstance(mapping, dict):
        found += list(mapping.values())
    return found


def _limiters(app: Any, outer: tuple[Any, ...] = ()) -> Iterator[tuple[WebSocketRateLimitMiddleware, tuple[Any, ...]]]:
    """Each WebSocketRateLimitMiddleware in `app`, with the applications around it (outermost first)."""
    if len(outer) > _MAX_DEPTH:
        return
    if isinstance(app, WebSocketRateLimitMiddleware):
        yield app, outer
    for child in _children(app):
        yield from _limiters(child, (*outer, app))


def _inside(app: Any, kind: str, depth: int = 0) -> bool:
    """True when an application whose class is named `kind` runs inside `app`."""
    if depth > _MAX_DEPTH:
        return False
    return any(type(child).__name__ == kind or _inside(child, kind, depth + 1) for child in _children(app))


def _application() -> Any:
    path = getattr(settings, "ASGI_APPLICATION", None)
    if not path:
        return None
    try:
        return import_string(path)
    except ImportError:
        return None  # Channels' own checks and the server report an application that cannot be imported


def _scopes_with_limits() -> set[str] | None:
    from ..models import TierLimit

    try:
        return set(TierLimit.objects.filter(enabled=True).exclude(scope="").values_list("scope", flat=True))
    except DatabaseError:  # not migrated yet: `migrate` comes first
        return None


@checks.register("ratelimit")
def check_channels_middleware(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W080 for each WebSocketRateLimitMiddleware of settings.ASGI_APPLICATION."""
    return _channels_messages(None)


@checks.register("ratelimit", checks.Tags.database)
def check_channels_message_scope(app_configs: Any = None, databases: Any = None,
                                 **kwargs: Any) -> list[checks.CheckMessage]:
    """W081 (a database check: the tiers' scopes are read from the database)."""
    if not databases:
        return []
    return [message for message in _channels_messages(_scopes_with_limits()) if message.id == "ratelimit.W081"]


def _channels_messages(scopes: set[str] | None) -> list[checks.CheckMessage]:
    """W080 for each WebSocketRateLimitMiddleware of settings.ASGI_APPLICATION, and W081 when `scopes` (the
    scopes some tier limits) is known."""
    application = _application()
    if application is None:
        return []
    messages: list[checks.CheckMessage] = []
    for limiter, outer in _limiters(application):
        if _inside(limiter, "AuthMiddleware"):
            messages.append(checks.Warning(
                "Channels' AuthMiddleware runs inside WebSocketRateLimitMiddleware: signed-in users' WebSocket "
                "connects and messages are limited as their client address's.",
                hint="Wrap the router with RateLimitMiddlewareStack(...) instead of AuthMiddlewareStack(...).",
                id="ratelimit.W080"))
        elif not any(isinstance(app, _TakeKey) for app in outer):
            messages.append(checks.Warning(
                "WebSocketRateLimitMiddleware is used without RateLimitMiddlewareStack: an API key in the query "
                "string stays in the server's scope, whose log line of the connection may show it.",
                hint="Wrap the router with RateLimitMiddlewareStack(...) (it includes AuthMiddlewareStack).",
                id="ratelimit.W080"))
        if scopes is not None and limiter.message_scope not in scopes:
            messages.append(checks.Warning(
                f"No tier limits the WebSocket message scope {limiter.message_scope!r}: messages are not limited.",
                hint=f"Add a limit with scope {limiter.message_scope!r} to the tiers in the admin "
                     "(docs/websockets.md), or pass the message_scope your tiers use.",
                id="ratelimit.W081"))
    return messages
