"""A request of each seeded tier is one Redis round trip: one EVALSHA, and no other command.

The demo project's settings (project/settings.py: the default RATELIMIT, so the per-IP limits (each
seeded tier's own) and the metrics are on; only the key prefix, the timeouts and the budget are the
test's own, see conftest), the tiers free, pro and enterprise as `migrate` seeds them, and keys of
each, warmed by one request (the key and its tier are then cached in process, the Redis connection is
open). Counted with MONITOR on the
shared Redis: every command a client sent (not those the decision script ran itself) that names this
test's key prefix, which every key the app writes for the test carries: the decision's keys, the
lookups' shared cache, a slot's sorted set, the metrics.

Left out, and named: the metrics flusher's batches (keys under "<prefix>:{metrics}", sent by a background
thread once a second, never on a request's path) and the deny cache's poll of the reset epoch
("<prefix>:{resets}:epoch", at most once per RESET_CHECK_INTERVAL, only while a denial is cached: no
request here is denied). `redis_commands` leaves out the edit epoch's reads ("<prefix>:{edits}:epoch",
once a second by a thread of each process: ratelimit_app.plans.edits).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import AsyncClient

from ratelimit_app.core.scripts import decide_sha, settle_sha
from ratelimit_app.service.limiter_async import get_async_limiter
from tests.support.limits_support import add_slots, make_key, parse_ietf, redis_commands, seed_tiers

pytestmark = pytest.mark.django_db(transaction=True)  # the ASGI request reads the key in another thread

SEEDED = ("free", "pro", "enterprise")


def on_a_request_path(commands: list[str], key_prefix: str) -> list[str]:
    """`commands` without the metrics' batches and the reset epoch's polls (see the module docstring)."""
    background = (f"{key_prefix}:{{metrics}}", f"{key_prefix}:{{resets}}")
    return [command for command in commands if not any(name in command for name in background)]


def names(commands: list[str]) -> list[str]:
    """The command of each line MONITOR printed ("EVALSHA", "ZREM")."""
    return [command.split()[0].strip('"').upper() for command in commands]


@pytest.fixture
def seeded_keys() -> dict[str, str]:
    seed_tiers()  # transactional tests flush tables: restore what the data migration seeds
    return {slug: make_key(slug) for slug in SEEDED}


def test_a_request_of_each_seeded_tier_is_one_evalsha_under_wsgi(
        client: Any, redis_url: str, key_prefix: str, seeded_keys: dict[str, str]) -> None:
    for key in seeded_keys.values():
        assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200  # warm
    with redis_commands(redis_url, key_prefix) as seen:
        responses = [client.get("/api/users", HTTP_X_API_KEY=key) for key in seeded_keys.values() for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 9
    assert [r["X-RateLimit-Tier"] for r in responses] == [slug for slug in SEEDED for _ in range(3)]
    # each tier's own per-IP limit is decided in the same call as its limits
    assert [parse_ietf(r["RateLimit-Policy"])["ip"]["q"] for r in responses[::3]] == [100, 1000, 10000]
    commands = on_a_request_path(seen, key_prefix)
    assert names(commands) == ["EVALSHA"] * 9, commands
    assert all(decide_sha() in command for command in commands)


def test_an_asgi_request_of_a_seeded_tier_is_one_evalsha(
        redis_url: str, key_prefix: str, seeded_keys: dict[str, str]) -> None:
    async def scenario() -> tuple[int, list[str]]:
        client, headers = AsyncClient(), {"X-API-Key": seeded_keys["free"]}
        try:
            assert (await client.get("/api/async/users", headers=headers)).status_code == 200  # warm
            with redis_commands(redis_url, key_prefix) as seen:
                response = await client.get("/api/async/users", headers=headers)
            return response.status_code, seen
        finally:
            await get_async_limiter().aclose()
            await sync_to_async(connections.close_all)()

    status, seen = asyncio.run(scenario())
    commands = on_a_request_path(seen, key_prefix)
    assert status == 200 and names(commands) == ["EVALSHA"], commands


def test_a_tier_given_a_concurrency_limit_pays_a_second_round_trip_to_give_its_slot_back(
        client: Any, redis_url: str, key_prefix: str, seeded_keys: dict[str, str]) -> None:
    """What docs/protection.md says a slot costs: the release after the response, one ZREM."""
    add_slots("pro", 10)
    key = seeded_keys["pro"]
    assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200  # warm (the tier is read again)
    with redis_commands(redis_url, key_prefix) as seen:
        response = client.get("/api/users", HTTP_X_API_KEY=key)
    commands = on_a_request_path(seen, key_prefix)
    assert response.status_code == 200 and names(commands) == ["EVALSHA", "ZREM"], commands



def test_a_key_this_process_has_not_looked_up_costs_a_peek_at_the_per_ip_limit_first(
        client: Any, redis_url: str, key_prefix: str, seeded_keys: dict[str, str]) -> None:
    """docs/operations.md: before the database is asked about a key never seen, the per-IP limit is
    peeked at (a flood of made-up keys costs no more than its per-IP limit); once looked up, one EVALSHA."""
    assert client.get("/api/users", HTTP_X_API_KEY=seeded_keys["pro"]).status_code == 200  # the script loaded
    with redis_commands(redis_url, key_prefix) as cold:
        first = client.get("/api/users", HTTP_X_API_KEY=seeded_keys["free"])
    with redis_commands(redis_url, key_prefix) as warm:
        second = client.get("/api/users", HTTP_X_API_KEY=seeded_keys["free"])
    assert (first.status_code, second.status_code) == (200, 200)
    decisions = [command for command in on_a_request_path(cold, key_prefix) if names([command]) == ["EVALSHA"]]
    # the peek names the address's key alone; the decision then names the tier's keys too
    assert [command.split()[2] for command in decisions] == ["1", "3"], decisions
    assert names(on_a_request_path(warm, key_prefix)) == ["EVALSHA"]


def test_a_request_that_reserves_usage_pays_one_more_round_trip_to_settle_it(
        client: Any, redis_url: str, key_prefix: str, seeded_keys: dict[str, str]) -> None:
    """docs/usage.md: the estimate is reserved in the decision's one EVALSHA; the settlement is one more."""
    key = seeded_keys["pro"]

    def chat() -> Any:
        response = client.post("/api/llm/chat", b'{"max_tokens": 50, "use": 3}', content_type="application/json",
                               HTTP_X_API_KEY=key)
        b"".join(response.streaming_content)
        response.close()
        return response

    assert chat().status_code == 200  # warm: the settling script loaded
    with redis_commands(redis_url, key_prefix) as seen:
        response = chat()
    commands = on_a_request_path(seen, key_prefix)
    assert response.status_code == 200 and names(commands) == ["EVALSHA", "EVALSHA"], commands
    assert decide_sha() in commands[0] and settle_sha() in commands[1]
