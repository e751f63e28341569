"""assert_limited / assert_not_limited on the answers of the middleware, the decorator and DRF's throttles
(JSON and problem details), and what their messages show."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.test import AsyncClient, Client
from rest_framework.test import APIClient

from ratelimit_app.testing import IsolatedRateLimit, assert_limited, assert_not_limited, make_api_key
from tests.support.limits_support import LimitSpec, make_tier

pytestmark = pytest.mark.django_db

HOURLY: list[LimitSpec] = [("hour", "sliding_window", 1, 3600, None, "")]


def refused_and_allowed(client: Any, path: str, **extra: Any) -> tuple[Any, Any]:
    allowed = client.get(path, **extra)
    for _ in range(10):
        refused = client.get(path, **extra)
        if refused.status_code == 429:
            return refused, allowed
    raise AssertionError(f"{path} was never refused")


def failure(check: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(AssertionError) as raised:
        check(*args, **kwargs)
    return str(raised.value)


def test_the_middlewares_refusal_names_its_policy_and_a_wrong_policy_is_reported(
        client: Client, ratelimit: IsolatedRateLimit) -> None:
    make_tier("hourly", HOURLY)
    key = make_api_key("hourly")
    refused, allowed = refused_and_allowed(client, "/api/users", HTTP_X_API_KEY=key)
    assert_limited(refused)
    assert_limited(refused, policy="hour")
    assert_not_limited(allowed)
    message = failure(assert_limited, refused, policy="burst")
    assert message.startswith("expected a 429 from the rate limiter refused by policy 'burst', got 429 Too Many")
    assert "  policy:  hour\n" in message
    assert "Retry-After: " in message and "X-RateLimit-Remaining: 0" in message and 'RateLimit: "ip";' in message
    assert '"error": "rate limit exceeded"' in message
    message = failure(assert_limited, allowed)
    assert message.splitlines()[:2] == ["expected a 429 from the rate limiter, got 200 OK", "  policy:  (none named)"]
    assert "X-RateLimit-Limit: 1" in message
    message = failure(assert_not_limited, refused)
    assert message.startswith("expected a response the rate limiter let through, got 429 Too Many Requests\n")


def test_problem_details_name_the_violated_policies(client: Client, settings: Any,
                                                   ratelimit: IsolatedRateLimit) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "ERROR_FORMAT": "problem"}
    make_tier("hourly", HOURLY)
    refused, _ = refused_and_allowed(client, "/api/users", HTTP_X_API_KEY=make_api_key("hourly"))
    assert refused["Content-Type"] == "application/problem+json"
    assert_limited(refused, policy="hour")


def test_a_drf_429_names_its_policy_from_the_outcome_left_on_the_request(ratelimit: IsolatedRateLimit) -> None:
    refused, allowed = refused_and_allowed(APIClient(), "/drf/items/", HTTP_X_API_KEY=make_api_key("free"))
    assert "policy" not in refused.json()  # DRF's own body: {"detail": "Request was throttled. ..."}
    assert_limited(refused, policy="burst")
    assert_not_limited(allowed)


def test_the_decorators_refusal_sync_and_async(client: Client, ratelimit: IsolatedRateLimit) -> None:
    refused, _ = refused_and_allowed(client, "/public/quote")
    assert_limited(refused, policy="quote")

    async def scenario() -> None:
        refused, _ = await _refused_async(AsyncClient(), "/public/async-quote")
        assert_limited(refused, policy="async-quote")

    asyncio.run(scenario())


async def _refused_async(client: AsyncClient, path: str) -> tuple[Any, Any]:
    allowed = await client.get(path)
    for _ in range(10):
        refused = await client.get(path)
        if refused.status_code == 429:
            return refused, allowed
    raise AssertionError(f"{path} was never refused")


def test_a_503_of_the_limiter_is_not_let_through_but_another_503_is(client: Client, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": "redis://127.0.0.1:1/0", "FAIL_MODE": "closed"}
    with pytest.warns(RuntimeWarning, match="could not delete the keys under 'rltest-"), IsolatedRateLimit():
        unavailable = client.get("/api/users", HTTP_X_API_KEY=make_api_key("free"))
    assert unavailable.status_code == 503
    assert "rate limiter unavailable" in failure(assert_not_limited, unavailable)
    assert "got 503 Service Unavailable" in failure(assert_limited, unavailable)

    class Plain503:
        status_code = 503
        headers = {"Content-Type": "text/plain"}
        content = b"maintenance"

    assert_not_limited(Plain503())
    assert failure(assert_limited, Plain503()).endswith("  headers: (no rate limit headers)\n  body:    maintenance")
