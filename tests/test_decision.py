"""Decision and PolicyResult are small frozen values: compared, hashed, pickled and copied as such."""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest

from ratelimit_app import Decision
from ratelimit_app.decision import PolicyResult


def test_decisions_are_frozen_values() -> None:
    values = ("minute", False, 20, 0, 12.5, math.inf)
    result = PolicyResult(*values)
    assert result == PolicyResult(*values) and hash(result) == hash(PolicyResult(*values))
    decision = Decision.from_results((result,), degraded=True)
    assert decision == Decision(False, 20, 0, 12.5, math.inf, "minute", (result,), True)
    for obj, name in ((result, "allowed"), (decision, "remaining")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, name, 1)
    assert pickle.loads(pickle.dumps(decision)) == decision  # noqa: S301 (our own bytes)
    assert dataclasses.replace(decision, degraded=False).degraded is False
    assert Decision(True, 1, 1, 1.0, None, "p", ()).degraded is False  # the class default
    assert decision.refused() == decision and not Decision.from_results((
        PolicyResult("p", True, 5, 4, 1.0, None),)).refused().allowed
