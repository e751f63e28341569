"""Decisions are immutable values: compared, hashed, pickled and copied by value."""

from __future__ import annotations

import math
import pickle

import pytest

from ratelimit_app import Decision
from ratelimit_app.core.decision import PolicyResult


def test_decisions_and_results_are_immutable_values() -> None:
    values = ("minute", False, 20, 0, 12.5, math.inf)
    result = PolicyResult(*values)
    assert result == PolicyResult(*values) and hash(result) == hash(PolicyResult(*values))
    decision = Decision(False, 20, 0, 12.5, math.inf, "minute", (result,), True)
    for obj, name in ((result, "allowed"), (decision, "remaining")):
        with pytest.raises(AttributeError):
            setattr(obj, name, 1)
    assert pickle.loads(pickle.dumps(decision)) == decision  # noqa: S301 (our own bytes)
    changed = decision._replace(degraded=False)
    assert changed.degraded is False and decision.degraded is True
    assert Decision(True, 1, 1, 1.0, None, "p", ()).degraded is False  # the class default
    assert Decision(True, 1, 1, 1.0, None, "p", ()).shadow == ()


def test_refused_keeps_where_the_caller_stands_and_only_turns_the_answer() -> None:
    result = PolicyResult("minute", True, 20, 7, 30.0, None)
    allowed = Decision.from_results((result,))
    refused = allowed.refused()
    assert not refused.allowed and refused._replace(allowed=True) == allowed


def test_from_results_reports_the_longest_wait_when_denied_and_the_tightest_limit_when_allowed() -> None:
    wide = PolicyResult("day", True, 1000, 900, 80_000.0, None)
    tight = PolicyResult("minute", True, 20, 3, 40.0, None)
    allowed = Decision.from_results((wide, tight))
    assert allowed.allowed and (allowed.policy, allowed.remaining) == ("minute", 3)
    short_wait = PolicyResult("burst", False, 10, 0, 3.0, 3.0)
    long_wait = PolicyResult("minute", False, 20, 0, 40.0, 40.0)
    denied = Decision.from_results((wide, short_wait, long_wait))
    assert not denied.allowed and (denied.policy, denied.retry_after) == ("minute", 40.0)
    assert denied.results == (wide, short_wait, long_wait)
