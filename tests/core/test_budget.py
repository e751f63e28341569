"""ratelimit_app.core.budget: `start_budget` / `end_budget` (through tests.support.budget), `time_left` and
`reply_wait` (the connections that read them are tested in test_redispy.py)."""

from __future__ import annotations

import time

from ratelimit_app.core.budget import reply_wait, time_left
from tests.support.budget import within_budget


def test_time_left_is_none_outside_a_budget_and_counts_down_inside() -> None:
    assert time_left() is None
    with within_budget(10.0):
        left = time_left()
        assert left is not None and 9.0 < left <= 10.0
    assert time_left() is None


def test_a_budget_counts_from_its_start_and_may_be_spent_before_it_is_entered() -> None:
    with within_budget(0.5, start=time.monotonic() - 2.0):
        left = time_left()
        assert left is not None and left <= -1.5


def test_the_inner_of_nested_budgets_applies_until_it_ends_then_the_outer_again() -> None:
    with within_budget(100.0):
        with within_budget(1.0):
            inner = time_left()
            assert inner is not None and inner <= 1.0
        outer = time_left()
        assert outer is not None and outer > 99.0
        with within_budget(1000.0):  # a looser inner budget is not clipped by the outer one either
            looser = time_left()
            assert looser is not None and looser > 999.0


def test_a_reply_waits_its_own_timeout_unless_the_budget_ends_first() -> None:
    assert reply_wait(5.0) == 5.0 and reply_wait(None) is None  # outside a budget
    with within_budget(10.0):
        assert reply_wait(5.0) == 5.0  # the budget ends later: the connection's own timer
    with within_budget(1.0):
        assert reply_wait(5.0) is None  # the service's timeout around the call ends the wait first
