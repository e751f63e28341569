"""The metered tier's monthly quota (3 requests per calendar month, Paris time): a month passes in a test."""

from __future__ import annotations

import pytest

from ratelimit_app.testing import assert_limited, assert_not_limited, make_api_key

pytestmark = pytest.mark.django_db


def test_the_monthly_quota_resets_on_the_first_of_the_month(client, ratelimit):
    key = make_api_key("metered")
    for _ in range(3):
        assert_not_limited(client.get("/api/products", HTTP_X_API_KEY=key))
    refused = client.get("/api/products", HTTP_X_API_KEY=key)
    assert_limited(refused, policy="month")
    until_the_first = refused.json()["retry_after"]  # seconds until 00:00 on the 1st in Paris
    ratelimit.advance(until_the_first - 60)
    assert_limited(client.get("/api/products", HTTP_X_API_KEY=key), policy="month")  # one minute to go
    ratelimit.advance(60)
    answer = client.get("/api/products", HTTP_X_API_KEY=key)
    assert_not_limited(answer)
    assert answer["X-RateLimit-Remaining"] == "2"


def test_two_months_later_the_quota_is_whole_again(client, ratelimit):
    key = make_api_key("metered")
    for _ in range(3):
        client.get("/api/products", HTTP_X_API_KEY=key)
    ratelimit.advance(62 * 86400)
    for _ in range(3):
        assert_not_limited(client.get("/api/products", HTTP_X_API_KEY=key))
    assert_limited(client.get("/api/products", HTTP_X_API_KEY=key), policy="month")
