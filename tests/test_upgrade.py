"""Upgrades never hurt: state written by the previous release's script is carried over by this one.

The previous release's decision script is kept in tests/legacy_lua (a copy of ratelimit_app/lua at
b1489e7). These tests write state with it, in its own key layout, then decide with today's engine: no
error, and never more than the limit granted within one period across the two.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
import redis

from ratelimit_app import Policy, RateLimiter, engine
from ratelimit_app.engine import ALGORITHM_CODES, identity_digest
from ratelimit_app.scripts import ALGORITHM_FILES, ENTRY_FILE, PRELUDE_FILE

LEGACY_DIR = Path(__file__).resolve().parent / "legacy_lua"
#: that release's algorithm files: today's but calendar_window.lua (calendar quotas came later) and
#: concurrency.lua (the previous release had no concurrency policy, so no previous-layout state to carry over)
LEGACY_ALGORITHM_FILES = tuple(name for name in ALGORITHM_FILES
                               if name not in ("calendar_window.lua", "concurrency.lua"))
LEGACY_SOURCE = "\n".join((LEGACY_DIR / name).read_text(encoding="utf-8")
                          for name in (PRELUDE_FILE, *LEGACY_ALGORITHM_FILES, ENTRY_FILE))
ALGORITHMS = sorted(name for name in ALGORITHM_CODES if name != "concurrency")


def legacy_hit(client: redis.Redis, prefix: str, identity: str, policies: list[Policy], cost: int = 1) -> bool:
    """Decide with the previous release's script and key layout, as its engine did; True when allowed."""
    keys = [f"{prefix}:{{{identity_digest(identity)}}}:{p.name}:{p.algorithm}" for p in policies]
    numbers = struct.pack(">qq", cost, 1) + b"".join(
        struct.pack(">qqqq", ALGORITHM_CODES[p.algorithm], p.limit, p.period_ms, p.capacity) for p in policies)
    reply = client.eval(LEGACY_SOURCE, len(keys), *keys, numbers)
    return bool(reply[0])


def away_from_a_window_edge(client: redis.Redis, period: int) -> None:
    """Wait out the last 5 s of a window aligned to the epoch: the windowed algorithms count exactly
    the units of one window only while no edge falls inside the test."""
    seconds, _ = client.time()
    left = period - seconds % period
    if left < 5:
        time.sleep(left + 0.05)


def test_the_legacy_fixture_is_the_previous_release() -> None:
    # a different script than today's, in the previous key layout
    assert "ZADD" in LEGACY_SOURCE and "KEYS[i]          state key of policy i" in LEGACY_SOURCE


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
    # the carried-over state now lives in today's key, which also counts the units admitted since
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


def test_reset_forgets_the_previous_layout_too(
    limiter: RateLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    policies = [Policy("minute", "sliding_window", limit=2, period=60)]
    assert legacy_hit(redis_client, key_prefix, "k", policies, cost=2)
    limiter.reset("k", policies)
    assert limiter.hit("k", policies, cost=2).allowed


def test_without_the_previous_layout_only_todays_keys_are_sent(
    limiter: RateLimiter, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "LEGACY_KEYS", False)
    engine._plan.cache_clear()
    try:
        policies = [Policy("minute", "sliding_window", limit=2, period=60), Policy("day", "gcra", limit=5, period=60)]
        call = engine.prepare_call(limiter.prefix, (("k", policies),), 1, charge=True)
        assert call.keys == limiter.keys("k", policies)
        assert [limiter.hit("k", policies).allowed for _ in range(3)] == [True, True, False]
    finally:
        engine._plan.cache_clear()


def test_a_concurrency_policy_never_reads_a_previous_layout_key(
    limiter: RateLimiter, redis_client: redis.Redis, key_prefix: str
) -> None:
    """The previous release had no concurrency policy: its key in that layout is sent (the keys are all
    or none) but never read, and a slot's sorted set (which MGET reads as nil) is never taken for a
    missing state that would send the script looking at the previous layout."""
    from ratelimit_app.engine import new_lease_token

    slots = Policy("concurrency", "concurrency", limit=2, period=60)
    minute = Policy("minute", "fixed_window", limit=10, period=60)
    keys = engine.reset_keys(key_prefix, "k", [minute, slots])
    assert len(keys) == 4 and keys[3].endswith(":concurrency:concurrency")
    redis_client.set(keys[3], "garbage")  # whatever lies there is not read
    tokens = [new_lease_token() for _ in range(3)]
    decisions = [limiter.hit("k", [minute, slots], lease=token) for token in tokens]
    assert [d.allowed for d in decisions] == [True, True, False] and decisions[2].policy == "concurrency"
    assert redis_client.zcard(keys[1]) == 2 and redis_client.get(keys[3]) == b"garbage"
    limiter.release([("k", slots)], tokens[0])
    assert limiter.hit("k", [minute, slots], lease=tokens[2]).allowed
    assert limiter.peek("k", [minute]).remaining == 7
