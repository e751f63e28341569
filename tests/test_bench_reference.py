"""The benchmark's lean reference middleware (bench/httpapp/reference.py) does what ours does for the
benchmark's request: the same EVALSHA, KEYS and ARGV byte for byte, and the same six headers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path
from redis.connection import AbstractConnection

from tests.support.limits_support import make_key, seed_tiers

pytestmark = pytest.mark.django_db

SIX = {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Tier", "RateLimit-Policy",
       "RateLimit"}


def ping(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


urlpatterns = [path("api/ping", ping)]


def _arguments(packed: bytes) -> list[bytes]:
    """The arguments of one RESP command (an array of bulk strings)."""
    count, _, rest = packed[1:].partition(b"\r\n")
    arguments = []
    for _ in range(int(count)):
        length, _, rest = rest[1:].partition(b"\r\n")
        arguments.append(rest[:int(length)])
        rest = rest[int(length) + 2:]
    return arguments


@pytest.fixture
def sent() -> Iterator[list[list[bytes]]]:
    """Every EVALSHA written to Redis while the test runs, as its list of arguments."""
    original = AbstractConnection.send_packed_command
    commands: list[list[bytes]] = []

    def recording(self: Any, command: Any, check_health: bool = True) -> None:
        packed = command if isinstance(command, bytes) else b"".join(bytes(part) for part in command)
        if b"EVALSHA" in packed[:40]:
            commands.append(_arguments(packed))
        original(self, command, check_health)

    AbstractConnection.send_packed_command = recording  # type: ignore[method-assign]
    try:
        yield commands
    finally:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]


@pytest.mark.urls(__name__)
def test_the_reference_sends_our_call_and_answers_with_our_headers(settings: Any, sent: list[list[bytes]]) -> None:
    seed_tiers()
    key = make_key("enterprise")
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": "1000000/m", "PATH_PREFIXES": ["/api/"]}
    answers = {}
    for middleware in ("ratelimit_app.middleware.RateLimitMiddleware",
                       "bench.httpapp.reference.ReferenceMiddleware"):
        settings.MIDDLEWARE = [middleware]
        client = Client()
        client.get("/api/ping", HTTP_X_API_KEY=key)  # the first request loads what is kept for the next ones
        sent.clear()
        response = client.get("/api/ping", HTTP_X_API_KEY=key)
        assert response.status_code == 200
        answers[middleware] = (sent[:], {name: response[name] for name in response.headers if name in SIX})
    (ours_calls, ours_headers), (reference_calls, reference_headers) = answers.values()
    assert len(ours_calls) == 1 and reference_calls == ours_calls  # the same EVALSHA, KEYS and ARGV
    assert set(reference_headers) == set(ours_headers) == SIX
    for name in ("X-RateLimit-Limit", "X-RateLimit-Tier", "RateLimit-Policy"):
        assert reference_headers[name] == ours_headers[name]
