"""The in-process fallback limiter (ratelimit_app.service.fallback) with an injected clock: exact admission and
recovery per algorithm, all-or-nothing, the share of each server, thread safety and bounded memory.

(Its agreement with the Lua scripts is checked against Redis in tests/service/test_fallback_models.py.)
"""

from __future__ import annotations

import math
import threading

import pytest

from ratelimit_app import Policy
from ratelimit_app.core.policies import ALGORITHMS
from ratelimit_app.service.fallback import LocalLimiter, local_share

START_US = 1_800_000_000_000_000  # a moment well inside every window used below


class FakeClock:
    """Microseconds since the epoch that only move when a test says so."""

    def __init__(self) -> None:
        self.now_us = START_US

    def __call__(self) -> int:
        return self.now_us

    def advance(self, seconds: float) -> None:
        self.now_us += round(seconds * 1_000_000)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_algorithm_admits_exactly_its_limit_then_recovers(clock: FakeClock, algorithm: str) -> None:
    limiter = LocalLimiter(clock=clock)
    policies = [Policy("p", algorithm, limit=5, period=10)]
    decisions = [limiter.hit("client", policies) for _ in range(7)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
    assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    denied = decisions[-1]
    assert denied.retry_after is not None and 0 < denied.retry_after <= 20
    clock.advance(denied.retry_after - 0.001)
    assert not limiter.hit("client", policies).allowed  # not a millisecond early
    clock.advance(0.001)
    assert limiter.hit("client", policies).allowed  # and exactly when the limiter said


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reset_after_names_the_full_recovery(clock: FakeClock, algorithm: str) -> None:
    limiter = LocalLimiter(clock=clock)
    policies = [Policy("p", algorithm, limit=3, period=10)]
    last = [limiter.hit("client", policies) for _ in range(3)][-1]
    assert last.allowed and last.remaining == 0
    clock.advance(last.reset_after)
    assert limiter.peek("client", policies).remaining == 3


def test_a_denied_request_charges_no_policy_and_no_identity(clock: FakeClock) -> None:
    limiter = LocalLimiter(clock=clock)
    burst = [Policy("burst", "token_bucket", limit=20, period=3600, burst=3)]
    minute = [Policy("minute", "sliding_window", limit=20, period=60)]
    for _ in range(3):
        assert all(d.allowed for d in limiter.hit_many([("ip:1", minute), ("key:a", burst)]))
    refused = limiter.hit_many([("ip:1", minute), ("key:a", burst)])
    assert [d.allowed for d in refused] == [False, False]
    assert refused[0].retry_after is None  # the IP was refused because the key was denied
    assert refused[1].policy == "burst" and refused[1].retry_after is not None
    assert limiter.peek("ip:1", minute).remaining == 17  # nothing charged by the refusal


def test_peek_charges_nothing_and_cost_is_charged_in_full(clock: FakeClock) -> None:
    limiter = LocalLimiter(clock=clock)
    policies = [Policy("p", "gcra", limit=10, period=60)]
    for _ in range(3):
        assert limiter.peek("k", policies).remaining == 10
    assert limiter.hit("k", policies, cost=4).remaining == 6
    assert limiter.hit("k", policies, cost=6).remaining == 0
    assert not limiter.hit("k", policies).allowed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cost_above_capacity_is_denied_forever_without_charge(clock: FakeClock, algorithm: str) -> None:
    limiter = LocalLimiter(clock=clock)
    policies = [Policy("p", algorithm, limit=5, period=60)]
    denied = limiter.hit("k", policies, cost=6)
    assert not denied.allowed and denied.retry_after == math.inf
    assert limiter.peek("k", policies).remaining == 5


def test_bad_arguments_raise_clear_errors(clock: FakeClock) -> None:
    limiter = LocalLimiter(clock=clock)
    policies = [Policy("p", "gcra", limit=5, period=60)]
    for cost in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="cost"):
            limiter.hit("k", policies, cost=cost)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="identity"):
        limiter.hit("", policies)
    with pytest.raises(TypeError, match="Policy"):
        limiter.hit("k", ["5/m"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="app_servers"):
        LocalLimiter(app_servers=0)


def test_reset_forgets_the_identity(clock: FakeClock) -> None:
    limiter = LocalLimiter(clock=clock)
    policies = [Policy("p", "sliding_window", limit=1, period=60)]
    assert limiter.hit("k", policies).allowed
    assert not limiter.hit("k", policies).allowed
    limiter.reset("k", policies)
    assert limiter.hit("k", policies).allowed


def test_each_server_enforces_its_share(clock: FakeClock) -> None:
    """APP_SERVERS = 4: windows allow limit // 4; token bucket and gcra keep rate / 4 and burst // 4."""
    limiter = LocalLimiter(app_servers=4, clock=clock)
    window = [Policy("w", "sliding_window", limit=20, period=60)]
    assert sum(limiter.hit("a", window).allowed for _ in range(20)) == 5
    bucket = [Policy("b", "token_bucket", limit=20, period=60, burst=8)]  # 20/min over 4 servers: 5/min
    assert sum(limiter.hit("b", bucket).allowed for _ in range(20)) == 2  # burst 8 // 4
    denied = limiter.hit("b", bucket)
    assert denied.retry_after == pytest.approx(12.0)  # one token per 12 s at 5/min
    assert denied.limit == 2
    clock.advance(12.0)
    assert limiter.hit("b", bucket).allowed
    tiny = [Policy("t", "fixed_window", limit=3, period=60)]
    assert local_share(tiny[0], 4) == (1.0, 60_000.0, 1.0)  # never below one
    assert sum(limiter.hit("c", tiny).allowed for _ in range(5)) == 1


def test_expired_state_counts_as_fresh(clock: FakeClock) -> None:
    limiter = LocalLimiter(clock=clock)
    policies = [Policy(f"p{i}", a, limit=2, period=1) for i, a in enumerate(ALGORITHMS)]
    assert limiter.hit("k", policies).allowed
    assert limiter.hit("k", policies).allowed
    assert not limiter.hit("k", policies).allowed
    clock.advance(2.0)  # past every state's lifetime (at most 2 x period)
    assert [r.remaining for r in limiter.peek("k", policies).results] == [2] * len(ALGORITHMS)


def test_a_clock_that_steps_back_never_refills(clock: FakeClock) -> None:
    limiter = LocalLimiter(clock=clock)
    policies = [Policy("b", "token_bucket", limit=1, period=10), Policy("g", "gcra", limit=1, period=10)]
    assert limiter.hit("k", policies).allowed
    clock.advance(-5.0)
    assert not limiter.hit("k", policies).allowed


def test_memory_is_bounded_by_max_keys(clock: FakeClock) -> None:
    limiter = LocalLimiter(clock=clock, max_keys=100)
    policies = [Policy("p", "sliding_window", limit=1, period=60)]
    for n in range(1000):
        assert limiter.hit(f"id{n}", policies).allowed
    assert len(limiter) == 100
    # the most recent identities are remembered, the oldest were dropped (which only ever allows more)
    assert not limiter.hit("id999", policies).allowed
    assert limiter.hit("id0", policies).allowed
    limiter.clear()
    assert len(limiter) == 0


def test_sliding_window_logs_are_bounded_by_max_units(clock: FakeClock) -> None:
    limiter = LocalLimiter(clock=clock, max_units=1000)
    policies = [Policy("p", "sliding_window", limit=300, period=60)]
    for n in range(10):
        assert limiter.hit(f"id{n}", policies, cost=300).allowed
    assert len(limiter) == 3  # 3 logs of 300 entries fit in 1,000; older ones were dropped
    assert not limiter.hit("id9", policies).allowed


def test_concurrent_threads_admit_exactly_the_limit() -> None:
    limiter = LocalLimiter()  # the real clock; a one-day period keeps refills out of the count
    policies = [Policy("tight", "token_bucket", limit=100, period=86400), Policy("w", "sliding_window", limit=500,
                                                                                  period=86400)]
    admitted = [0] * 32
    barrier = threading.Barrier(32)

    def run(slot: int) -> None:
        barrier.wait()
        for _ in range(10):
            admitted[slot] += limiter.hit("hot", policies).allowed

    threads = [threading.Thread(target=run, args=(slot,)) for slot in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 100
    assert [r.remaining for r in limiter.peek("hot", policies).results] == [0, 400]


def test_renew_moves_the_end_of_live_slots_only(clock: FakeClock) -> None:
    """The model of lua/renew.lua (tests/core/test_leases.py runs the script itself)."""
    slots = Policy("slots", "concurrency", limit=1, period=60)
    limiter = LocalLimiter(clock=clock)
    assert limiter.hit("a", [slots], lease="first").allowed
    assert limiter.renew([("a", slots)], "first", 2000) == 1  # the first lease: 2 s from now
    clock.advance(1.5)
    assert limiter.renew([("a", slots)], "first") == 1  # confirmed: 60 s from now
    clock.advance(59)
    assert not limiter.hit("a", [slots], lease="other").allowed  # still held
    clock.advance(1)
    assert limiter.renew([("a", slots)], "first") == 0  # ran out: never taken again
    assert limiter.hit("a", [slots], lease="other").allowed
    assert limiter.renew([("a", slots)], "other", 1000) == 1
    clock.advance(1)
    assert limiter.renew([("a", slots)], "other") == 0 and limiter.hit("a", [slots], lease="third").allowed
    limiter.release([("a", slots)], "third")
    assert limiter.renew([("a", slots)], "third") == 0
