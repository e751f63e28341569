"""`manage.py check` over the Channels middleware of settings.ASGI_APPLICATION: the order of the middleware
(W080) and a message scope no tier limits (W081)."""

from __future__ import annotations

from typing import Any

import pytest
from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.checks import run_checks

from project.routing import websocket_urlpatterns
from ratelimit_app.channels.middleware import RateLimitMiddlewareStack, WebSocketRateLimitMiddleware
from tests.support.limits_support import seed_tiers

ROUTER = URLRouter(websocket_urlpatterns)
AUTH_INSIDE = ProtocolTypeRouter({"websocket": WebSocketRateLimitMiddleware(AuthMiddlewareStack(ROUTER))})
WITHOUT_STACK = ProtocolTypeRouter({"websocket": AuthMiddlewareStack(WebSocketRateLimitMiddleware(ROUTER))})
OTHER_SCOPE = ProtocolTypeRouter({"websocket": RateLimitMiddlewareStack(ROUTER, message_scope="chat")})


def ours(databases: Any = None) -> list[Any]:
    return [m for m in run_checks(databases=databases) if m.id in ("ratelimit.W080", "ratelimit.W081")]


@pytest.mark.django_db
def test_the_demo_passes() -> None:
    seed_tiers()
    assert ours(["default"]) == []


@pytest.mark.parametrize("application", ["AUTH_INSIDE", "WITHOUT_STACK"])
def test_the_middleware_outside_the_stack_is_warned_about(settings: Any, application: str) -> None:
    settings.ASGI_APPLICATION = f"tests.channels.test_checks.{application}"
    [warning] = ours()
    assert warning.id == "ratelimit.W080"
    assert ("AuthMiddleware runs inside" in warning.msg) == (application == "AUTH_INSIDE")


@pytest.mark.django_db
def test_a_message_scope_no_tier_limits_is_warned_about(settings: Any) -> None:
    seed_tiers()
    settings.ASGI_APPLICATION = "tests.channels.test_checks.OTHER_SCOPE"
    [warning] = ours(["default"])
    assert warning.id == "ratelimit.W081" and "'chat'" in warning.msg
    assert ours() == []  # without the database, the tiers are not read


def test_no_asgi_application_no_check(settings: Any) -> None:
    del settings.ASGI_APPLICATION
    assert ours() == []
