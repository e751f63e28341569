"""RATELIMIT['BACKEND'] = "memory": the site's limits decided in this process (the middleware, the decorator,
DRF's throttles, concurrency slots; sync and async), with nothing sent to Redis, and one store per key
prefix that outlives settings changes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import AsyncClient, Client
from rest_framework.test import APIClient

from ratelimit_app import Policy
from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.core.policies import CONCURRENCY
from ratelimit_app.observability import recorder
from ratelimit_app.service import memory
from ratelimit_app.service.limiter import get_limiter
from ratelimit_app.service.limiter_async import get_async_limiter
from tests.support.limits_support import add_slots, make_key, seed_tiers
from tests.support.tcp_proxy import TcpProxy, tcp_proxy

HOUR = Policy("hour", "fixed_window", limit=2, period=3600)


@pytest.fixture
def proxy(redis_url: str) -> Iterator[TcpProxy]:
    """The real Redis behind a proxy that records every byte sent to it."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with tcp_proxy("127.0.0.1", port) as running:
        yield running


@pytest.fixture
def in_memory(settings: Any, proxy: TcpProxy) -> Iterator[None]:
    settings.RATELIMIT = {**settings.RATELIMIT, "BACKEND": "memory", "REDIS_URL": proxy.url}
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    yield
    memory.forget(ratelimit_settings.KEY_PREFIX)


def statuses(client: Any, path: str, count: int, **extra: Any) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(count)]


@pytest.mark.django_db
def test_the_sites_limits_hold_in_process_and_redis_is_never_asked(in_memory: None, proxy: TcpProxy) -> None:
    client, key = Client(), make_key("free")
    assert statuses(client, "/api/users", 11, HTTP_X_API_KEY=key) == [200] * 10 + [429]  # the free burst
    assert client.get("/api/users", HTTP_X_API_KEY=key).json()["policy"] == "burst"
    assert statuses(client, "/public/quote", 6) == [200] * 5 + [429]  # @ratelimit
    assert statuses(APIClient(), "/drf/items/", 11, HTTP_X_API_KEY=make_key("free")) == [200] * 10 + [429]

    async def asynchronous() -> list[int]:
        async_client = AsyncClient()
        return [(await async_client.get("/public/async-quote")).status_code for _ in range(6)]

    assert asyncio.run(asynchronous()) == [200] * 5 + [429]
    assert recorder.flush()  # the metrics stay in process too
    assert (proxy.connections, bytes(proxy.from_clients)) == (0, b"")


@pytest.mark.django_db
def test_concurrency_slots_are_held_until_the_response_is_closed(in_memory: None, proxy: TcpProxy) -> None:
    add_slots("free", 2)  # 2 requests in flight
    client, key = Client(), make_key("free")
    streams = [client.get("/api/stream?chunks=2&ms=0", HTTP_X_API_KEY=key) for _ in range(2)]
    refused = client.get("/api/stream?chunks=2&ms=0", HTTP_X_API_KEY=key)
    assert refused.status_code == 429 and refused.json()["policy"] == "concurrency"
    streams[0].close()  # the first stream is done: its slot is given back
    assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200
    streams[1].close()
    assert (proxy.connections, bytes(proxy.from_clients)) == (0, b"")


def test_the_service_decides_all_or_nothing_and_shares_its_store_with_the_async_service(in_memory: None) -> None:
    service = get_limiter()
    assert isinstance(service.limiter(), memory.MemoryLimiter)
    assert [d.allowed for d in service.hit_many([("a", [HOUR]), ("b", [HOUR])])] == [True, True]
    assert service.hit("b", [HOUR]).allowed
    assert [d.allowed for d in service.hit_many([("a", [HOUR]), ("b", [HOUR])])] == [False, False]
    assert service.peek("a", [HOUR]).remaining == 1  # "b" refused the pair: "a" was not charged
    assert asyncio.run(get_async_limiter().hit("a", [HOUR])).remaining == 0
    service.reset("a", [HOUR])
    assert asyncio.run(get_async_limiter().peek("a", [HOUR])).remaining == 2
    slot = Policy("slot", CONCURRENCY, limit=1, period=60)
    assert service.hit("c", [slot], lease="first").allowed
    assert not service.hit("c", [slot], lease="second").allowed
    assert service.renew([("c", slot)], "first", 1000) is True
    assert asyncio.run(get_async_limiter().renew([("c", slot)], "first")) is True
    assert asyncio.run(get_async_limiter().release([("c", slot)], "first"))
    assert service.renew([("c", slot)], "first") is False  # given back: not taken again
    assert service.hit("c", [slot], lease="second").allowed


def test_a_prefixs_store_outlives_settings_changes_until_it_is_forgotten(settings: Any, in_memory: None) -> None:
    assert get_limiter().hit("k", [HOUR]).remaining == 1
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": "5/m"}  # a new service, the same store
    assert get_limiter().hit("k", [HOUR]).remaining == 0
    own = ratelimit_settings.KEY_PREFIX
    settings.RATELIMIT = {**settings.RATELIMIT, "KEY_PREFIX": f"{own}-other"}
    assert get_limiter().hit("k", [HOUR]).remaining == 1  # another prefix, another store
    memory.forget(f"{own}-other")
    settings.RATELIMIT = {**settings.RATELIMIT, "KEY_PREFIX": own}
    memory.forget(own)
    assert get_limiter().hit("k", [HOUR]).remaining == 1


@pytest.mark.django_db(transaction=True)
def test_a_route_that_reserves_usage_is_answered_without_redis(in_memory: None, proxy: TcpProxy) -> None:
    """The memory backend keeps no estimates: a usage limit counts the request's cost there, nothing is
    settled, and the request is answered (never the fail mode's answer to an error)."""
    seed_tiers()
    key = make_key("pro")
    body = b'{"max_tokens": 500, "use": 2}'
    response = Client().post("/api/llm/chat", body, content_type="application/json", HTTP_X_API_KEY=key)
    assert response.status_code == 200 and '"llm.tokens";r=1999;' in response["RateLimit"]
    b"".join(response.streaming_content)  # type: ignore[attr-defined]
    response.close()

    async def asynchronous() -> int:
        answer = await AsyncClient().post("/api/llm/chat", body, content_type="application/json",
                                          headers={"X-API-Key": key})
        async for _ in answer.streaming_content:  # type: ignore[attr-defined]
            pass
        return answer.status_code

    assert asyncio.run(asynchronous()) == 200
    assert (proxy.connections, bytes(proxy.from_clients)) == (0, b"")
