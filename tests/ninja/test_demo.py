"""The demo site's Django Ninja API (project/demo/ninja_api.py, mounted at /ninja/), with the seeded
tiers and the real Redis: TierRateThrottle for the whole API, the drop-in, the decorator, and Ninja's
docs and schema left unlimited."""

from __future__ import annotations

from typing import Any

import pytest

from ..support.limits_support import make_key, parse_ietf

pytestmark = pytest.mark.django_db


def test_the_api_is_limited_by_the_keys_tier(client: Any) -> None:
    key = make_key("free")
    responses = [client.get("/ninja/users", HTTP_X_API_KEY=key) for _ in range(11)]
    assert [r.status_code for r in responses] == [200] * 10 + [429]  # the free tier's burst of 10
    assert responses[0].json()["users"] and responses[0]["X-RateLimit-Tier"] == "free"
    assert responses[-1].json() == {"detail": "Too many requests."} and int(responses[-1]["Retry-After"]) >= 1
    assert client.get("/ninja/users").json() == {"error": "API key required"}


def test_a_write_costs_five(client: Any) -> None:
    key = make_key("free")
    written = client.post("/ninja/data", HTTP_X_API_KEY=key)
    assert written.status_code == 200 and parse_ietf(written["RateLimit"])["burst"]["r"] == 5


def test_the_async_operation(client: Any) -> None:
    key = make_key("free")
    # the sync operation caches the key in process: on the event loop the async one plans without I/O
    # (a cold key is read in another thread, which would not see this test's uncommitted key)
    assert client.get("/ninja/users", HTTP_X_API_KEY=key).status_code == 200
    second = client.get("/ninja/async/users", HTTP_X_API_KEY=key)
    assert second.status_code == 200 and parse_ietf(second["RateLimit"])["burst"]["r"] == 8


def test_the_public_operations_take_anonymous_clients(client: Any) -> None:
    statuses = [client.get(url).status_code for url in ("/ninja/public", "/ninja/async/public") * 3]
    assert statuses == [200] * 5 + [429]  # one throttle on both: they count together


def test_the_decorated_operation(client: Any) -> None:
    responses = [client.get("/ninja/quote") for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 5 + [429]
    assert responses[-1].json()["policy"] == "quote"


def test_docs_and_schema_are_never_limited(client: Any) -> None:
    responses = [client.get(url) for url in ("/ninja/docs", "/ninja/openapi.json") * 15]
    assert all(r.status_code == 200 for r in responses)
    assert not any("X-RateLimit-Limit" in r for r in responses)
    assert "/ninja/users" in responses[1].json()["paths"]
