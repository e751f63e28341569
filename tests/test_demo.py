"""The demo site's own views follow the advice of the docs: no 500 when Redis is down or a body is
hostile, and no stream that outlives the leases it holds. Through Django's test client, on the demo
URLconf, against a redis-server of the test's own (which it stops)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import Client

from devtools.embedded import RedisProcess
from tests.support.limits_support import make_key, make_tier, seed_tiers

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/api/slow?ms=0", "/api/export?ms=0", "/api/checkout?ms=0"])
def test_slow_views_answer_without_their_counts_when_redis_is_down(settings: Any, server: RedisProcess,
                                                                  path: str) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url, "FAIL_MODE": "open",
                          "SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2, "BUDGET_MS": 200}
    seed_tiers()
    key = make_key("free")
    client = Client(raise_request_exception=False)
    assert client.get(path, HTTP_X_API_KEY=key).json()["in_flight"] == 1  # counted in Redis while it answers
    server.stop()
    response = client.get(path, HTTP_X_API_KEY=key)
    assert response.status_code == 200, response.content  # the limiter failed open, and so does the demo
    assert response.json()["in_flight"] is None and response.json()["in_flight_of_kind"] is None


def test_deeply_nested_json_is_a_400(client: Client) -> None:
    seed_tiers()
    key = make_key("free")
    nested = b"[" * 100_000 + b"]" * 100_000
    response = client.post("/api/data", nested, content_type="application/json", HTTP_X_API_KEY=key)
    assert response.status_code == 400 and "nested" in response.json()["error"]


def test_a_stream_ends_within_half_the_shortest_lease_it_holds(client: Client) -> None:
    tier = make_tier("short", [("minute", "fixed_window", 100, 60, None, ""),
                               ("concurrency", "concurrency", 2, 2, None, "")])  # a 2-second slot
    key = make_key(tier)
    started = time.monotonic()
    response = client.get("/api/stream?chunks=1000&ms=400", HTTP_X_API_KEY=key)
    chunks = []
    for chunk in response.streaming_content:  # type: ignore[attr-defined]
        chunks.append(chunk)
        assert len(chunks) <= 3, "the stream outlives half of its 2-second lease"
    assert chunks == [b"chunk 0\n", b"chunk 1\n", b"chunk 2\n"]  # 0, 0.4 and 0.8 s: within 1 s
    assert time.monotonic() - started < 2
    response.close()
