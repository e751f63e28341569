"""The DRF search (throttle scope 'search', 5 a minute) and the views with a limit of their own."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient
from rest_framework.test import APIClient

from ratelimit_app.testing import assert_limited, assert_not_limited, make_api_key

pytestmark = pytest.mark.django_db


def test_the_search_allows_five_a_minute(ratelimit):
    client = APIClient()
    key = make_api_key("pro")
    for _ in range(5):
        assert_not_limited(client.get("/api/search", HTTP_X_API_KEY=key))
    assert_limited(client.get("/api/search", HTTP_X_API_KEY=key), policy="search")
    ratelimit.advance(60)
    assert_not_limited(client.get("/api/search", HTTP_X_API_KEY=key))


def test_a_client_subscribes_three_times_an_hour(client, ratelimit):
    for _ in range(3):
        assert_not_limited(client.post("/newsletter/subscribe"))
    assert_limited(client.post("/newsletter/subscribe"), policy="subscribe")
    ratelimit.advance(3600)
    assert_not_limited(client.post("/newsletter/subscribe"))


def test_the_async_quote_allows_two_a_minute(ratelimit):
    async def scenario():
        client = AsyncClient()
        answers = [await client.get("/quote") for _ in range(3)]
        ratelimit.advance(60)
        return answers, await client.get("/quote")

    answers, later = async_to_sync(scenario)()
    assert_not_limited(answers[0])
    assert_not_limited(answers[1])
    assert_limited(answers[2], policy="quote")
    assert_not_limited(later)


def test_the_async_api_under_the_middleware(ratelimit):
    key = make_api_key("free")

    async def scenario():
        client = AsyncClient()
        return [await client.get("/api/live", headers={"X-API-Key": key}) for _ in range(11)]

    # async_to_sync, not asyncio.run: the view's database reads then see the test's transaction (the key)
    answers = async_to_sync(scenario)()
    for answer in answers[:10]:
        assert_not_limited(answer)
    assert_limited(answers[10], policy="burst")
