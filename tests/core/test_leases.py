"""ratelimit_app.core.leases (lua/renew.lua, lua/cancel.lua) on a real Redis, through the sync engine and
its async twin: a renewal moves the end of the live slots of one lease token only, never takes back a
slot that was given back, cancelled or ran out, keeps each key's TTL at least its longest lease, and is
one call per identity."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from devtools.embedded import free_port
from ratelimit_app import AsyncRateLimiter, BackendError, Policy, RateLimiter, new_lease_token
from ratelimit_app.core.keys import renew_calls
from ratelimit_app.core.redispy import close_client

SLOTS = Policy("concurrency", "concurrency", limit=2, period=60)
FLEET = Policy("fleet", "concurrency", limit=100, period=30)
HELD = [("key:abc", SLOTS), ("fleet", FLEET)]


def ends_in_ms(client: redis.Redis, limiter: RateLimiter, identity: str, policy: Policy, token: str) -> float | None:
    """Milliseconds until `token`'s lease of `policy` ends, by Redis' clock (None: no member)."""
    [key] = limiter.keys(identity, [policy])
    score = client.zscore(key, token)
    if score is None:
        return None
    seconds, micros = client.time()
    return (score - (seconds * 1_000_000 + micros)) / 1000


def take(limiter: RateLimiter) -> str:
    token = new_lease_token()
    assert all(decision.allowed for decision in limiter.hit_many([("key:abc", [SLOTS]), ("fleet", [FLEET])],
                                                                 lease=token))
    return token


def test_a_renewal_shortens_then_extends_the_live_slots_of_its_token_only(
        redis_client: redis.Redis, limiter: RateLimiter) -> None:
    token, other = take(limiter), take(limiter)
    assert limiter.renew(HELD, token, 2000) == 2  # the first lease: both slots end 2 s from now
    for identity, policy in HELD:
        assert 1500 < ends_in_ms(redis_client, limiter, identity, policy, token) <= 2000  # type: ignore[operator]
        # the other request's lease and the key's TTL are as they were
        assert ends_in_ms(redis_client, limiter, identity, policy, other) > 2000  # type: ignore[operator]
        [key] = limiter.keys(identity, [policy])
        assert redis_client.pttl(key) > policy.period_ms - 5000
    assert limiter.renew(HELD, token) == 2  # confirmed: each one its full period from now
    assert 59_000 < ends_in_ms(redis_client, limiter, "key:abc", SLOTS, token) <= 60_000  # type: ignore[operator]
    assert 29_000 < ends_in_ms(redis_client, limiter, "fleet", FLEET, token) <= 30_000  # type: ignore[operator]
    assert limiter.renew(HELD, token, 120_000) == 2  # never past a policy's period
    assert ends_in_ms(redis_client, limiter, "key:abc", SLOTS, token) <= 60_000  # type: ignore[operator]


def test_a_late_renewal_takes_no_slot_again(redis_client: redis.Redis, limiter: RateLimiter) -> None:
    released, cancelled, ended = take(limiter), take(limiter), new_lease_token()
    limiter.release(HELD, released)
    limiter.cancel(HELD, cancelled)
    assert limiter.renew(HELD, released) == 0 and limiter.renew(HELD, cancelled) == 0
    assert limiter.renew(HELD, ended) == 0  # never taken
    short = Policy("short", "concurrency", limit=1, period=60)
    assert limiter.hit("key:abc", [short], lease=ended).allowed
    assert limiter.renew([("key:abc", short)], ended, 1) == 1
    while ends_in_ms(redis_client, limiter, "key:abc", short, ended) > 0:  # type: ignore[operator]
        pass  # Redis' clock, read until the 1 ms lease has run out
    assert limiter.renew([("key:abc", short)], ended) == 0
    assert ends_in_ms(redis_client, limiter, "key:abc", short, ended) <= 0  # type: ignore[operator]
    # every slot of the limit is free: nothing the late renewals did holds one
    assert [limiter.hit("key:abc", [SLOTS], lease=new_lease_token()).allowed for _ in range(3)] == [True, True, False]
    assert limiter.hit("key:abc", [short], lease=new_lease_token()).allowed


def test_one_call_per_identity_whose_keys_share_its_hash_tag(key_prefix: str) -> None:
    calls = renew_calls(key_prefix, [*HELD, ("key:abc", FLEET)], 5000)
    assert [(len(keys), lengths) for keys, lengths in calls] == [(2, [5000, 5000]), (1, [5000])]
    for keys, _ in calls:
        assert len({key.split("{")[1].split("}")[0] for key in keys}) == 1
    assert [lengths for _, lengths in renew_calls(key_prefix, HELD, None)] == [[60_000], [30_000]]


def test_bad_input_is_refused_before_anything_is_sent(limiter: RateLimiter) -> None:
    for token, lease_ms in (("bad token", 1000), (None, 1000), ("ok", 0), ("ok", 1.5), ("ok", True)):
        with pytest.raises(ValueError):
            limiter.renew(HELD, token, lease_ms)  # type: ignore[arg-type]


def test_a_renewal_redis_cannot_answer_raises_backend_error(key_prefix: str) -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    with pytest.raises(BackendError, match="could not renew slots"):
        RateLimiter(client, prefix=key_prefix).renew(HELD, new_lease_token())


def test_the_async_engine_renews_as_the_sync_one_does(redis_url: str, redis_client: redis.Redis,
                                                      key_prefix: str) -> None:
    sync = RateLimiter(redis_client, prefix=key_prefix)
    token = take(sync)

    async def scenario() -> list[Any]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            limiter = AsyncRateLimiter(client, prefix=key_prefix)
            first = await limiter.renew(HELD, token, 1500)
            shortened = ends_in_ms(redis_client, sync, "key:abc", SLOTS, token)
            full = await limiter.renew(HELD, token)
            await limiter.release(HELD, token)
            return [first, shortened, full, await limiter.renew(HELD, token)]
        finally:
            await close_client(client)

    first, shortened, full, late = asyncio.run(scenario())
    assert (first, full, late) == (2, 2, 0)
    assert 1000 < shortened <= 1500


def test_the_async_engine_cancels_as_the_sync_one_does(redis_url: str, limiter: RateLimiter) -> None:
    token = take(limiter)

    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            await AsyncRateLimiter(client, prefix=limiter.prefix).cancel(HELD, token)
        finally:
            await close_client(client)

    asyncio.run(scenario())
    assert limiter.renew(HELD, token) == 0  # given back, and never taken again under this token
    take(limiter), take(limiter)  # both of the two slots are free (take asserts each is allowed)
