"""ratelimit_app.service.guard: `RedisGuard`, the failure handling one decision goes through. The fail modes'
answers, the breaker's say on which calls reach Redis, what goes into the deny cache and what a reset
epoch read does to a cached denial; and `check_fail_mode` / `without_limits`. The decisions handed to
the guard as Redis' are made by a real RateLimiter."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from ratelimit_app import Policy, RateLimiter, new_lease_token
from ratelimit_app.service.breaker import CALL, PROBE, SKIP, CircuitBreaker
from ratelimit_app.service.fallback import LocalLimiter
from ratelimit_app.service.guard import OPEN_DECISION, RedisGuard, check_fail_mode, without_limits

MINUTE = (Policy("minute", "fixed_window", limit=2, period=60),)
SLOT = (Policy("inflight", "concurrency", limit=1, period=30),)


def guard(**options: Any) -> RedisGuard:
    options.setdefault("breaker", CircuitBreaker(1, 30.0, 60.0))
    return RedisGuard(**options)


def test_check_fail_mode_names_the_choices() -> None:
    assert [check_fail_mode(mode) for mode in ("open", "closed", "local")] == ["open", "closed", "local"]
    with pytest.raises(ValueError, match="fail_mode: 'ajar' is not one of open, closed, local"):
        check_fail_mode("ajar")


def test_without_limits_only_closed_refuses() -> None:
    refused = without_limits("closed")
    assert (refused.allowed, refused.degraded, refused.retry_after) == (False, True, 1.0)
    for mode in ("open", "local"):
        allowed = without_limits(mode)
        assert allowed.allowed and allowed.degraded and allowed.results == ()


def test_options_are_checked_and_a_shared_guard_takes_none(settings: Any) -> None:
    with pytest.raises(ValueError, match="fail_mode"):
        RedisGuard(fail_mode="ajar")
    with pytest.raises(ValueError, match="budget_ms"):
        RedisGuard(budget_ms=0)
    shared = RedisGuard(fail_mode="closed", budget_ms=250)
    assert (shared.fail_mode, shared.budget) == ("closed", 0.25)
    assert RedisGuard.shared_or_new(shared, {}) is shared
    with pytest.raises(TypeError, match="not both"):
        RedisGuard.shared_or_new(shared, {"fail_mode": "open", "budget_ms": 10})
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "local", "BUDGET_MS": 80, "APP_SERVERS": 4,
                          "DENY_CACHE_SIZE": 7}
    built = RedisGuard.shared_or_new(None, {})
    assert (built.fail_mode, built.budget, built.deny_cache.size) == ("local", 0.08, 7)


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_bad_input_is_refused_the_same_way_without_redis(mode: str) -> None:
    with pytest.raises(ValueError, match="cost"):
        guard().degraded(mode, [("client", MINUTE)], 0, charge=True)
    with pytest.raises(ValueError, match="lease"):
        guard().degraded(mode, [("client", SLOT)], 1, charge=True)


def test_open_allows_every_check_and_closed_refuses_until_the_next_probe() -> None:
    now = [1000.0]
    g = guard(breaker=CircuitBreaker(1, 30.0, 60.0, clock=lambda: now[0]))
    checks = [("ip:1", MINUTE), ("key:a", MINUTE)]
    assert g.degraded("open", checks, 1, charge=True) == [OPEN_DECISION, OPEN_DECISION]
    refused = g.degraded("closed", checks, 1, charge=True)
    assert [(d.allowed, d.degraded, d.retry_after) for d in refused] == [(False, True, 30.0)] * 2  # the cool-down
    g.breaker.record_failure("down")
    now[0] += 25.5
    [soon] = g.degraded("closed", checks[:1], 1, charge=True)
    assert soon.retry_after == pytest.approx(4.5)  # when the breaker will try Redis again
    stats = g.stats()
    assert (stats.degraded_open, stats.degraded_closed, stats.degraded) == (1, 2, 3)


def test_local_counts_each_share_allowed_ones_are_degraded_and_a_refusal_is_a_plain_429() -> None:
    g = guard(fallback=LocalLimiter(app_servers=1))
    answers = [g.degraded("local", [("client", MINUTE)], 1, charge=True)[0] for _ in range(3)]
    assert [(d.allowed, d.degraded) for d in answers] == [(True, True), (True, True), (False, False)]
    assert answers[1].remaining == 0 and answers[2].policy == "minute"
    assert g.degraded("local", [("client", MINUTE)], 1, charge=False)[0].allowed is False  # a peek: not charged
    stats = g.stats()
    assert (stats.local_allowed, stats.local_denied, stats.local_states) == (2, 2, 1)


def test_an_open_breaker_answers_with_the_fail_mode_without_redis() -> None:
    g = guard(fail_mode="closed")
    g.breaker.record_failure("down")
    call = g.open([("client", MINUTE)], 1, None, charge=True, fresh=False, prefix="rl")
    assert call.step == SKIP and call.answer is not None and not call.answer[0].allowed
    call = g.open([("client", MINUTE)], 1, "open", charge=True, fresh=False, prefix="rl")
    assert call.answer == [OPEN_DECISION]  # a per-call fail mode (a tier's) wins over the guard's


def test_a_failure_counts_towards_the_breaker_and_the_fail_mode_answers() -> None:
    g = guard(fail_mode="open", breaker=CircuitBreaker(2, 30.0, 60.0))
    for _ in range(2):
        call = g.open([("client", MINUTE)], 1, None, charge=True, fresh=False, prefix="rl")
        assert call.step == CALL and call.answer is None
        assert g.failed(call, ConnectionError("refused")) == [OPEN_DECISION]
    assert g.breaker.state == "open" and g.stats().redis_failures == 2


def test_a_denial_redis_made_is_cached_and_answered_until_a_fresh_report_or_a_reset(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    limiter, g = RateLimiter(redis_client, prefix=key_prefix), guard()
    checks = [("client", MINUTE)]
    for _ in range(3):
        call = g.open(checks, 1, None, charge=True, fresh=False, prefix=key_prefix)
        assert call.answer is None
        last = g.answered(call, limiter.hit_many(checks))
    assert not last[0].allowed and len(g.deny_cache) == 1
    cached = g.open(checks, 1, None, charge=True, fresh=False, prefix=key_prefix)
    assert cached.answer is not None and not cached.answer[0].allowed and cached.answer[0].policy == "minute"
    assert g.open(checks, 1, None, charge=False, fresh=True, prefix=key_prefix).answer is None  # fresh: asks Redis
    assert g.open(checks, 2, None, charge=True, fresh=False, prefix=key_prefix).answer is None  # another cost
    g.forget_locally("client", MINUTE)
    assert g.open(checks, 1, None, charge=True, fresh=False, prefix=key_prefix).answer is None


def test_a_refusal_for_want_of_a_slot_is_never_cached(redis_client: redis.Redis, key_prefix: str) -> None:
    limiter, g = RateLimiter(redis_client, prefix=key_prefix), guard()
    checks = [("client", SLOT)]
    held = new_lease_token()
    g.answered(g.open(checks, 1, None, True, False, key_prefix, held), limiter.hit_many(checks, lease=held))
    lease = new_lease_token()
    refused = g.answered(g.open(checks, 1, None, True, False, key_prefix, lease), limiter.hit_many(checks, lease=lease))
    assert not refused[0].allowed and len(g.deny_cache) == 0  # the slot may free at any moment


def deny_until_cached(g: RedisGuard, limiter: RateLimiter, checks: list[Any]) -> None:
    """Charge through the guard until Redis denies (and the guard caches the denial)."""
    while g.answered(g.open(checks, 1, None, True, False, limiter.prefix), limiter.hit_many(checks))[0].allowed:
        pass


def test_the_reset_epoch_is_read_before_a_cached_denial_at_most_once_per_interval(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    limiter, g = RateLimiter(redis_client, prefix=key_prefix), guard()
    checks = [("client", MINUTE)]
    deny_until_cached(g, limiter, checks)
    first = g.open(checks, 1, None, True, False, key_prefix)
    assert first.answer is not None and first.watch is g.reset_watch(key_prefix)
    again = g.open(checks, 1, None, True, False, key_prefix)
    assert again.answer is not None and again.watch is None
    assert g.open(checks, 1, None, True, False, None).watch is None  # no engine yet: no epoch to read
    g.breaker.record_failure("down")
    g.reset_watch(key_prefix).interval = 0.0
    assert g.open(checks, 1, None, True, False, key_prefix).watch is None  # never while the breaker is open


def test_a_cached_denial_stands_unless_the_reset_epoch_changed(redis_client: redis.Redis, key_prefix: str) -> None:
    limiter, g = RateLimiter(redis_client, prefix=key_prefix), guard()
    checks = [("client", MINUTE)]
    watch = g.reset_watch(key_prefix)
    watch.interval = 0.0  # due on every lookup
    deny_until_cached(g, limiter, checks)
    call = g.open(checks, 1, None, True, False, key_prefix)
    assert call.watch is watch
    assert g.epoch_read(call, redis_client.get(watch.key)).answer is None  # a first read counts as a change
    assert len(g.deny_cache) == 0
    deny_until_cached(g, limiter, checks)
    call = g.open(checks, 1, None, True, False, key_prefix)
    assert g.epoch_read(call, redis_client.get(watch.key)).answer is not None  # unchanged: the denial stands
    call = g.open(checks, 1, None, True, False, key_prefix)
    assert call.watch is watch and g.epoch_read(call, None, failed=True).answer is not None  # unreadable: stands
    watch.announce(redis_client)  # another process reset something
    call = g.open(checks, 1, None, True, False, key_prefix)
    after = g.epoch_read(call, redis_client.get(watch.key))
    assert after.answer is None and len(g.deny_cache) == 0 and after.step == CALL


def test_a_probe_that_ends_without_asking_redis_lets_the_next_caller_probe() -> None:
    now = [1000.0]
    g = guard(breaker=CircuitBreaker(1, 30.0, 60.0, clock=lambda: now[0]))
    g.breaker.record_failure("down")
    now[0] += 30.0
    assert g.step() == PROBE
    assert g.step() is None  # half-open: everyone else skips Redis
    g.abandoned(PROBE)
    assert g.step() == PROBE
    g.succeeded(PROBE)
    assert g.breaker.state == "closed" and g.step() == CALL


def test_when_the_breaker_closes_the_local_fallback_starts_clean(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "BREAKER_FAILURES": 1, "BREAKER_COOLDOWN": 0.001,
                          "BREAKER_MAX_COOLDOWN": 0.001}
    g = RedisGuard(fallback=LocalLimiter(app_servers=1))  # its own breaker, which reports to the guard
    g.degraded("local", [("client", MINUTE)], 1, charge=True)
    assert len(g.fallback) == 1
    g.count_failure(CALL, ConnectionError("down"))
    assert g.breaker.state == "open"
    while (step := g.step()) is None:  # the cool-down is a millisecond
        pass
    g.succeeded(step)
    assert g.breaker.state == "closed" and len(g.fallback) == 0
