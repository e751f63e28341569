"""Property test: the Lua engine and its pure-Python model (ratelimit_app.service.fallback) decide alike.

Hypothesis generates policies and sequences of hits, peeks, resets and multi-identity hits; each
operation runs against Redis and against the model, whose clock is set to Redis TIME read just
before the operation. Periods are long (366 days: windows, refills and expiries cannot move during a
test), so `allowed` and `remaining` must be equal; the times (`reset_after`, `retry_after`) must agree
within the time the operation took, twice over, plus rounding.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit_app import Decision, Policy, RateLimiter
from ratelimit_app.core.calendars import CALENDAR_PERIODS, CALENDARS
from ratelimit_app.core.policies import ALGORITHMS, BURST_ALGORITHMS
from ratelimit_app.service.fallback import LocalLimiter

LONG = 366 * 86400  # seconds: the longest period a policy may have
SETTINGS = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@st.composite
def policies_of(draw: Any, algorithm: str, name: str) -> Policy:
    limit = draw(st.integers(1, 12))
    burst = draw(st.integers(1, 12)) if algorithm in BURST_ALGORITHMS and draw(st.booleans()) else None
    return Policy(name, algorithm, limit=limit, period=LONG, burst=burst)


@st.composite
def policy_sets(draw: Any) -> list[Policy]:
    algorithms = draw(st.lists(st.sampled_from(ALGORITHMS), min_size=1, max_size=3))
    return [draw(policies_of(algorithm, f"p{i}")) for i, algorithm in enumerate(algorithms)]


OPERATION = st.tuples(st.sampled_from(["hit", "hit", "hit", "peek", "reset", "many"]), st.integers(1, 14))


class Pair:
    """The engine and the model side by side, the model's clock following Redis TIME."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.engine = RateLimiter(client, prefix=prefix)
        self.now_us = 0
        self.model = LocalLimiter(clock=lambda: self.now_us)
        self.slowest = 0.0

    def run(self, operation: str, checks: list[tuple[str, list[Policy]]], cost: int, shift: int = 0) -> None:
        started = time.perf_counter()
        seconds, micros = self.client.time()
        self.now_us = seconds * 1_000_000 + micros
        identity, policies = checks[0]
        if operation == "hit":
            engine = [self.engine.hit(identity, policies, cost, clock_shift_ms=shift)]
            model = [self.model.hit(identity, policies, cost, clock_shift_ms=shift)]
        elif operation == "peek":
            engine = [self.engine.peek(identity, policies, cost, clock_shift_ms=shift)]
            model = [self.model.peek(identity, policies, cost, clock_shift_ms=shift)]
        elif operation == "reset":
            self.engine.reset(identity, policies)
            self.model.reset(identity, policies)
            return
        else:
            engine, model = self.engine.hit_many(checks, cost), self.model.hit_many(checks, cost)
        self.slowest = max(self.slowest, time.perf_counter() - started)
        tolerance = 2 * self.slowest + 0.002
        assert len(engine) == len(model)
        for got, expected in zip(engine, model, strict=True):
            assert_same(got, expected, tolerance, operation, cost)


def assert_same(got: Decision, expected: Decision, tolerance: float, operation: str, cost: int) -> None:
    context = f"{operation} cost={cost}: engine {got} vs model {expected}"
    assert got.allowed == expected.allowed, context
    assert len(got.results) == len(expected.results), context
    for engine, model in zip(got.results, expected.results, strict=True):
        assert (engine.policy, engine.allowed, engine.limit, engine.remaining) == (
            model.policy, model.allowed, model.limit, model.remaining), context
        assert abs(engine.reset_after - model.reset_after) <= tolerance, context
        if engine.retry_after is None or model.retry_after is None or math.isinf(model.retry_after):
            assert engine.retry_after == model.retry_after, context
        else:
            assert abs(engine.retry_after - model.retry_after) <= tolerance, context


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@SETTINGS
@given(data=st.data())
def test_each_algorithm_matches_its_model(redis_client: redis.Redis, key_prefix: str, algorithm: str,
                                          data: Any) -> None:
    pair = Pair(redis_client, key_prefix)
    identity = uuid.uuid4().hex
    policies = [data.draw(policies_of(algorithm, "p"))]
    operations = data.draw(st.lists(OPERATION, min_size=1, max_size=25))
    for operation, cost in operations:
        pair.run("hit" if operation == "many" else operation, [(identity, policies)], cost)


@SETTINGS
@given(first=policy_sets(), second=policy_sets(), operations=st.lists(
    st.tuples(OPERATION, st.booleans()), min_size=1, max_size=30))
def test_multi_policy_and_multi_identity_decisions_match_the_model(
        redis_client: redis.Redis, key_prefix: str, first: list[Policy], second: list[Policy],
        operations: list[tuple[tuple[str, int], bool]]) -> None:
    pair = Pair(redis_client, key_prefix)
    a, b = (uuid.uuid4().hex, first), (uuid.uuid4().hex, second)
    for (operation, cost), flip in operations:
        checks = [a, b] if operation == "many" else [b if flip else a]
        pair.run(operation, checks, cost)


DAY_MS = 86_400_000


@SETTINGS
@given(unit=st.sampled_from(CALENDARS), zone=st.sampled_from(["UTC", "Europe/Paris", "America/New_York",
                                                              "Asia/Kolkata", "Australia/Lord_Howe"]),
       limit=st.integers(1, 5), own_shift=st.integers(-2 * DAY_MS, 2 * DAY_MS),
       steps=st.lists(st.tuples(st.sampled_from(["hit", "hit", "peek"]), st.integers(1, 6),
                                st.integers(0, 70 * DAY_MS)), min_size=1, max_size=20))
def test_calendar_quotas_match_their_model_across_the_periods_the_clock_shift_crosses(
        redis_client: redis.Redis, key_prefix: str, unit: str, zone: str, limit: int, own_shift: int,
        steps: list[tuple[str, int, int]]) -> None:
    """Calendar days, weeks and months, their boundaries crossed by the call's clock shift (and the
    policy's own), decided by calendar_window.lua and by its model alike."""
    pair = Pair(redis_client, key_prefix)
    policy = Policy("quota", "fixed_window", limit=limit, period=CALENDAR_PERIODS[unit], calendar=unit,
                    time_zone=zone, clock_shift_ms=own_shift)
    identity = uuid.uuid4().hex
    for operation, cost, shift in sorted(steps, key=lambda step: step[2]):  # time moves forward
        pair.run(operation, [(identity, [policy])], cost, shift)

