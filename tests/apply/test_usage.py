"""Usage limits in request handling: estimates from the request (a 400 when one cannot be made), the
meter a view reports to, settled once; and the reservation through RateLimitMiddleware's sync path."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import RequestFactory

from ratelimit_app.apply.usage import UsageMeter, _duration, declare, estimate, estimators_of
from ratelimit_app.core.policies import Policy
from ratelimit_app.core.usage import Reservation
from ratelimit_app.decorators import usage


def view(request: Any) -> None:
    return None


def test_an_estimate_is_read_from_the_request_or_answered_400() -> None:
    request = RequestFactory().post("/", json.dumps({"max_tokens": 7}), content_type="application/json")
    tokens = {"tokens": lambda r: json.loads(r.body)["max_tokens"]}
    assert estimate(request, tokens) == (("tokens", 7),)
    bad = RequestFactory().post("/", b"nonsense", content_type="application/json")
    response = estimate(bad, tokens)
    assert not isinstance(response, tuple) and response.status_code == 400
    assert json.loads(response.content)["unit"] == "tokens"

    def refuse(request: Any) -> int:
        raise ValueError("max_tokens must be at most 4096")

    refused = estimate(request, {"tokens": refuse})
    assert not isinstance(refused, tuple) and "at most 4096" in json.loads(refused.content)["detail"]
    zero = estimate(request, {"tokens": lambda r: 0})
    assert not isinstance(zero, tuple) and zero.status_code == 400


def test_a_declaration_names_real_units_and_functions() -> None:
    declared = usage(tokens=lambda r: 1)(view)
    assert set(estimators_of(declared) or {}) == {"tokens"}
    with pytest.raises(ValueError, match="@usage on"):
        usage(**{"Tokens!": lambda r: 1})(view)
    with pytest.raises(ValueError, match="must be a function"):
        usage(tokens=5)(view)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one unit"):
        declare(view, {})


def test_a_meter_adds_reports_of_its_units_and_settles_once() -> None:
    policy = Policy("tokens", "sliding_window", limit=100, period=60, unit="tokens")
    meter = UsageMeter(Reservation("rl", (("key:x", (policy,)),), (("tokens", 50),), 0.0))
    assert meter.take() is None  # nothing reported: the estimate stays charged
    meter = UsageMeter(Reservation("rl", (("key:x", (policy,)),), (("tokens", 50),), 0.0))
    meter.report("tokens", 3)
    meter.report("tokens", 4)
    meter.report("words", 9)  # reserved nothing of: ignored
    with pytest.raises(ValueError, match="whole number"):
        meter.report("tokens", -1)
    assert meter.take() == {"tokens": 7}
    assert meter.take() is None


def test_waits_are_spelt_as_llm_apis_spell_them() -> None:
    assert [_duration(s) for s in (0.5, 12, 90, 3725)] == ["0.5s", "12s", "1m30s", "1h2m5s"]
