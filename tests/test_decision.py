"""The fast constructors of Decision and PolicyResult make the same frozen objects as the classes."""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest

from ratelimit_app import Decision
from ratelimit_app.decision import PolicyResult, new_decision, new_policy_result


def test_fast_constructors_build_the_same_frozen_objects() -> None:
    values = ("minute", False, 20, 0, 12.5, math.inf)
    fast, slow = new_policy_result(*values), PolicyResult(*values)
    assert type(fast) is PolicyResult and fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    decision_values = (False, 20, 0, 12.5, math.inf, "minute", (fast,), True)
    decision = new_decision(*decision_values)
    assert type(decision) is Decision and decision == Decision(*decision_values)
    for obj, name in ((fast, "allowed"), (decision, "remaining")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, 1)
    assert pickle.loads(pickle.dumps(decision)) == decision  # noqa: S301 (our own bytes)
    assert dataclasses.replace(decision, degraded=False).degraded is False
    assert new_decision(True, 1, 1, 1.0, None, "p", ()).degraded is False  # the class default
