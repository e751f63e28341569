"""ratelimit_app.service.guard: `RedisGuard`, the failure handling every call to Redis goes through, as steps the
tests drive by hand (a call's reply sent in, or its failure thrown in). The fail modes' answers, the
breaker's say on which calls reach Redis, what goes into the deny cache, what a reset epoch read does to a
cached denial, a release Redis could not take; and `check_fail_mode` / `without_limits`. The calls the
steps ask for are made on a real RateLimiter."""

from __future__ import annotations

from typing import Any, TypeVar, cast

import pytest
import redis

from ratelimit_app import Policy, RateLimiter, new_lease_token
from ratelimit_app.service.breaker import PROBE, SKIP, CircuitBreaker
from ratelimit_app.service.fallback import LocalLimiter
from ratelimit_app.service.guard import OPEN_DECISION, RedisGuard, check_fail_mode, without_limits
from ratelimit_app.service.servicecall import Steps

T = TypeVar("T")

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


def answer(steps: Steps[T]) -> T:
    """What steps return at once, without asking for any call."""
    with pytest.raises(StopIteration) as done:
        next(steps)
    return cast(T, done.value.value)


def run(steps: Steps[T], engine: Any) -> T:
    """Drive steps by hand (as the services do, without a budget): each call they ask for made on `engine`."""
    reply: Any = None
    while True:
        try:
            ask = steps.send(reply)
        except StopIteration as done:
            return cast(T, done.value)
        run_it, _ = ask
        reply = run_it(engine)


def test_an_open_breaker_answers_with_the_fail_mode_without_redis() -> None:
    g = guard(fail_mode="closed")
    g.breaker.record_failure("down")
    [refused] = answer(g.decide(None, [("client", MINUTE)], 1, None, True))
    assert not refused.allowed and refused.degraded
    # a per-call fail mode (a tier's) wins over the guard's
    assert answer(g.decide(None, [("client", MINUTE)], 1, "open", True)) == [OPEN_DECISION]


def test_a_failure_counts_towards_the_breaker_and_the_fail_mode_answers() -> None:
    g = guard(fail_mode="open", breaker=CircuitBreaker(2, 30.0, 60.0))
    for _ in range(2):
        steps = g.decide(None, [("client", MINUTE)], 1, None, True)
        assert next(steps)[1] is not None  # the decision, within the budget from then
        with pytest.raises(StopIteration) as done:
            steps.throw(ConnectionError("refused"))
        assert done.value.value == [OPEN_DECISION]
    assert g.breaker.state == "open" and g.stats().redis_failures == 2


def test_a_call_abandoned_for_another_reason_goes_on_up_and_gives_the_probe_back() -> None:
    now = [1000.0]
    g = guard(breaker=CircuitBreaker(1, 30.0, 60.0, clock=lambda: now[0]))
    g.breaker.record_failure("down")
    now[0] += 30.0
    steps = g.decide(None, [("client", MINUTE)], 1, None, True)
    next(steps)  # the probe
    assert g.breaker.before_call() == SKIP  # half-open: everyone else skips Redis
    with pytest.raises(KeyError):
        steps.throw(KeyError("not Redis' doing"))
    assert g.breaker.before_call() == PROBE and g.stats().redis_failures == 0


def test_a_denial_redis_made_is_cached_and_answered_until_a_fresh_report_or_a_reset(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    limiter, g = RateLimiter(redis_client, prefix=key_prefix), guard()
    checks = [("client", MINUTE)]  # (no engine named to the steps: no reset epoch to read)
    last = [run(g.decide(None, checks, 1, None, True), limiter) for _ in range(3)][-1]
    assert not last[0].allowed and len(g.deny_cache) == 1
    [cached] = answer(g.decide(None, checks, 1, None, True))
    assert not cached.allowed and cached.policy == "minute"
    assert next(g.decide(None, checks, 1, None, False, fresh=True))  # fresh: asks Redis
    assert next(g.decide(None, checks, 2, None, True))  # another cost
    run(g.reset("client", MINUTE), limiter)
    assert len(g.deny_cache) == 0 and run(g.decide(None, checks, 1, None, True), limiter)[0].allowed


def test_a_refusal_for_want_of_a_slot_is_never_cached(redis_client: redis.Redis, key_prefix: str) -> None:
    limiter, g = RateLimiter(redis_client, prefix=key_prefix), guard()
    checks = [("client", SLOT)]
    run(g.decide(limiter, checks, 1, None, True, lease=new_lease_token()), limiter)
    refused = run(g.decide(limiter, checks, 1, None, True, lease=new_lease_token()), limiter)
    assert not refused[0].allowed and len(g.deny_cache) == 0  # the slot may free at any moment


def deny_until_cached(g: RedisGuard, limiter: RateLimiter, checks: list[Any]) -> None:
    """Charge through the guard until Redis denies (and the guard caches the denial)."""
    while run(g.decide(limiter, checks, 1, None, True), limiter)[0].allowed:
        pass


def test_the_reset_epoch_is_read_before_a_cached_denial_at_most_once_per_interval(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    limiter, g = RateLimiter(redis_client, prefix=key_prefix), guard()
    checks = [("client", MINUTE)]
    deny_until_cached(g, limiter, checks)
    first = g.decide(limiter, checks, 1, None, True)
    assert next(first)[1] is None  # the epoch read, with a budget of its own
    assert not run(first, limiter)[0].allowed  # no reset announced: the denial stands
    assert not answer(g.decide(limiter, checks, 1, None, True))[0].allowed  # not due again yet
    g.reset_watch(key_prefix).interval = 0.0
    assert not answer(g.decide(None, checks, 1, None, True))[0].allowed  # no engine yet: no epoch to read
    g.breaker.record_failure("down")
    assert not answer(g.decide(limiter, checks, 1, None, True))[0].allowed  # never while the breaker is open


def test_a_cached_denial_stands_unless_the_reset_epoch_changed(redis_client: redis.Redis, key_prefix: str) -> None:
    limiter, g = RateLimiter(redis_client, prefix=key_prefix), guard()
    checks = [("client", MINUTE)]
    watch = g.reset_watch(key_prefix)
    watch.interval = 0.0  # due on every lookup
    deny_until_cached(g, limiter, checks)
    steps = g.decide(limiter, checks, 1, None, True)
    assert next(steps)[0](limiter) is None and steps.send(None)[1] is not None  # a first read: a change
    assert len(g.deny_cache) == 0
    deny_until_cached(g, limiter, checks)
    assert not run(g.decide(limiter, checks, 1, None, True), limiter)[0].allowed  # unchanged: the denial stands
    steps = g.decide(limiter, checks, 1, None, True)
    next(steps)
    with pytest.raises(StopIteration) as unreadable:
        steps.throw(redis.ConnectionError("down"))
    assert not unreadable.value.value[0].allowed and len(g.deny_cache) == 1  # unreadable: the denial stands
    watch.announce(redis_client)  # another process reset something
    steps = g.decide(limiter, checks, 1, None, True)
    assert steps.send(next(steps)[0](limiter))[1] is not None  # on to Redis
    assert len(g.deny_cache) == 0


def test_a_release_redis_could_not_take_is_sent_again_once_it_answers(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    limiter, g = RateLimiter(redis_client, prefix=key_prefix), guard()
    g.settle_with(lambda steps: run(steps, limiter))
    lease = new_lease_token()
    assert run(g.decide(limiter, [("client", SLOT)], 1, None, True, lease=lease), limiter)[0].allowed
    steps = g.release([("client", SLOT[0])], lease, local=False)
    next(steps)
    with pytest.raises(StopIteration) as failed:
        steps.throw(redis.ConnectionError("down"))
    assert failed.value.value is False and len(g.lost_leases) == 1 and g.stats().redis_failures == 1
    assert answer(g.renew([("client", SLOT[0])], lease, None, local=False)) is None  # the breaker skips Redis
    g.breaker.record_success(probe=False)
    assert g.lost_leases.settled(10)
    assert run(g.decide(limiter, [("client", SLOT)], 1, None, True, lease=new_lease_token()), limiter)[0].allowed


def test_when_the_breaker_closes_the_local_fallback_starts_clean(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "BREAKER_FAILURES": 1, "BREAKER_COOLDOWN": 0.001,
                          "BREAKER_MAX_COOLDOWN": 0.001}
    g = RedisGuard(fallback=LocalLimiter(app_servers=1))  # its own breaker, which reports to the guard
    g.degraded("local", [("client", MINUTE)], 1, charge=True)
    assert len(g.fallback) == 1
    g.breaker.record_failure(ConnectionError("down"))
    assert g.breaker.state == "open"
    while (step := g.breaker.before_call()) == SKIP:  # the cool-down is a millisecond
        pass
    g.breaker.record_success(probe=step == PROBE)
    assert g.breaker.state == "closed" and len(g.fallback) == 0
