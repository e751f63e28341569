"""Upgrades never hurt: state written by the previous release's script is carried over by this one.

The previous release's decision script is kept in tests/legacy_lua (a copy of ratelimit_app/core/lua at
311ea9b: a key per policy, "<prefix>:{<digest>}<letter><policy>"). These tests write state with it, in
its own key layout, then decide with today's engine (one key per identity): no error, and never more
than the limit granted within one period across the two.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
import redis

from ratelimit_app import Policy, RateLimiter
from ratelimit_app.core import engine
from ratelimit_app.core.calendars import CALENDAR_PERIODS
from ratelimit_app.core.engine import ALGORITHM_CODES, CALENDAR_CODE, KEY_LETTERS, identity_digest, new_lease_token

LEGACY_DIR = Path(__file__).resolve().parent / "legacy_lua"
#: that release's files, in the order its scripts.py joined them
LEGACY_FILES = ("prelude.lua", "fixed_window.lua", "sliding_window.lua", "sliding_window_counter.lua",
                "token_bucket.lua", "gcra.lua", "calendar_window.lua", "concurrency.lua", "decide.lua")
LEGACY_SOURCE = "\n".join((LEGACY_DIR / name).read_text(encoding="utf-8") for name in LEGACY_FILES)
ALGORITHMS = sorted(name for name in ALGORITHM_CODES if name != "concurrency")


def legacy_key(prefix: str, identity: str, policy: Policy) -> str:
    """A policy's key in the previous release's layout."""
    letter = "k" if policy.calendar else KEY_LETTERS[policy.algorithm]
    return f"{prefix}:{{{identity_digest(identity)}}}{letter}{policy.name}"


def legacy_hit(client: redis.Redis, prefix: str, identity: str, policies: list[Policy], cost: int = 1,
               lease: str | None = None) -> bool:
    """Decide with the previous release's script and key layout, as its engine did; True when allowed."""
    keys = [legacy_key(prefix, identity, p) for p in policies]
    numbers = struct.pack(">qq", cost, 1) + b"".join(
        struct.pack(">qqqq", CALENDAR_CODE, p.limit, p.calendar_rule, p.clock_shift_ms) if p.calendar else
        struct.pack(">qqqq", ALGORITHM_CODES[p.algorithm], p.limit, p.period_ms, p.capacity) for p in policies)
    reply = client.eval(LEGACY_SOURCE, len(keys), *keys, numbers, *([lease] if lease else []))
    # that release's reply: (remaining, reset_ms, retry_ms) per policy; allowed when no retry_ms
    return not any(retry for _, _, retry in struct.iter_unpack(">qqq", reply))


def away_from_a_window_edge(client: redis.Redis, period: int) -> None:
    """Wait out the last 5 s of a window aligned to the epoch: the windowed algorithms count exactly
    the units of one window only while no edge falls inside the test."""
    seconds, _ = client.time()
    left = period - seconds % period
    if left < 5:
        time.sleep(left + 0.05)


def test_the_legacy_fixture_is_the_previous_release() -> None:
    # a different script than today's: a key per policy (KEYS[i]), its algorithms functions of their own
    assert "KEYS[i]          state key of policy i" in LEGACY_SOURCE
    assert "local function token_bucket(stored, legacy, now_us" in LEGACY_SOURCE


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_state_written_before_the_upgrade_is_carried_over(
    algorithm: str, limiter: RateLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    policies = [Policy("hour", algorithm, limit=5, period=3600)]
    away_from_a_window_edge(redis_client, 3600)
    assert [legacy_hit(redis_client, key_prefix, "k", policies) for _ in range(3)] == [True] * 3
    # today's engine sees the 3 units already used: 2 more, then denied, with the old state's retry time
    assert limiter.peek("k", policies).remaining == 2
    assert [limiter.hit("k", policies).allowed for _ in range(3)] == [True, True, False]
    denied = limiter.hit("k", policies)
    # (a sliding window counter may wait into the next window, while the previous one still weighs)
    assert not denied.allowed and denied.retry_after is not None and 0 < denied.retry_after <= policies[0].state_ttl
    # the carried-over state now lives in the identity's key, which also counts the units admitted since
    [key] = limiter.keys("k", policies)
    assert redis_client.exists(key) == 1


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_full_legacy_limit_stays_full(
    algorithm: str, limiter: RateLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    policies = [Policy("hour", algorithm, limit=4, period=3600)]
    away_from_a_window_edge(redis_client, 3600)
    assert legacy_hit(redis_client, key_prefix, "k", policies, cost=4)
    assert not legacy_hit(redis_client, key_prefix, "k", policies)
    decision = limiter.hit("k", policies)
    assert not decision.allowed and decision.remaining == 0
    assert limiter.hit("k", policies, cost=2).allowed is False


def test_a_calendar_quota_is_carried_over(limiter: RateLimiter, redis_client: redis.Redis, key_prefix: str) -> None:
    quota = [Policy("month", "fixed_window", limit=5, period=CALENDAR_PERIODS["month"], calendar="month",
                    time_zone="UTC")]
    assert legacy_hit(redis_client, key_prefix, "k", quota, cost=4)
    assert [limiter.hit("k", quota).allowed for _ in range(2)] == [True, False]


def test_a_tier_half_written_before_the_upgrade_grants_no_more_than_its_limits(
    limiter: RateLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    tier = [
        Policy("burst", "token_bucket", limit=20, period=60, burst=10),
        Policy("minute", "sliding_window", limit=20, period=60),
        Policy("day", "fixed_window", limit=1000, period=86400),
    ]
    away_from_a_window_edge(redis_client, 86400)
    before = sum(legacy_hit(redis_client, key_prefix, "k", tier) for _ in range(6))
    after = sum(limiter.hit("k", tier).allowed for _ in range(20))
    # the burst of 10 holds across the upgrade (refill over the test's milliseconds is far below a token)
    assert (before, after) == (6, 4)
    assert limiter.peek("k", tier).results[2].remaining == 1000 - 10


def test_a_policy_first_decided_after_the_upgrade_on_another_route_is_still_carried_over(
    limiter: RateLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    """The identity's key may already exist (another route's policies wrote it) when a policy is first
    decided by today's engine: its state in the previous layout is read all the same."""
    minute, day = Policy("minute", "fixed_window", limit=10, period=60), Policy("day", "gcra", limit=5, period=86400)
    away_from_a_window_edge(redis_client, 60)
    assert legacy_hit(redis_client, key_prefix, "k", [day], cost=4)
    assert limiter.hit("k", [minute]).allowed  # writes the identity's key, with minute's entry only
    assert [limiter.hit("k", [minute, day]).allowed for _ in range(2)] == [True, False]
    assert limiter.peek("k", [minute]).remaining == 8


def test_reset_forgets_the_previous_layout_too(
    limiter: RateLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    policies = [Policy("minute", "sliding_window", limit=2, period=60)]
    assert legacy_hit(redis_client, key_prefix, "k", policies, cost=2)
    limiter.reset("k", policies)
    assert redis_client.exists(legacy_key(key_prefix, "k", policies[0])) == 0
    assert limiter.hit("k", policies, cost=2).allowed


def test_without_the_previous_layout_only_the_identity_key_is_sent(
    limiter: RateLimiter, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "LEGACY_KEYS", False)
    engine._plan.cache_clear()
    try:
        policies = [Policy("minute", "sliding_window", limit=2, period=60), Policy("day", "gcra", limit=5, period=60)]
        call = engine.prepare_call(limiter.prefix, (("k", policies),), 1, charge=True)
        assert call.keys == limiter.keys("k", policies)[:1]
        assert [limiter.hit("k", policies).allowed for _ in range(3)] == [True, True, False]
    finally:
        engine._plan.cache_clear()


def test_slots_held_before_the_upgrade_still_count(
    limiter: RateLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    """A concurrency policy keeps its own sorted set, under the name it had: leases taken by the
    previous release count, and are released, the same."""
    slots = Policy("concurrency", "concurrency", limit=2, period=60)
    minute = Policy("minute", "fixed_window", limit=10, period=60)
    old_token = new_lease_token()
    assert legacy_hit(redis_client, key_prefix, "k", [minute, slots], lease=old_token)
    assert limiter.keys("k", [slots]) == [legacy_key(key_prefix, "k", slots)]
    tokens = [new_lease_token() for _ in range(2)]
    decisions = [limiter.hit("k", [minute, slots], lease=token) for token in tokens]
    assert [d.allowed for d in decisions] == [True, False] and decisions[1].policy == "concurrency"
    limiter.release([("k", slots)], old_token)
    assert limiter.hit("k", [minute, slots], lease=tokens[1]).allowed
    assert limiter.peek("k", [minute]).remaining == 7
