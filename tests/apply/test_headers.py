"""Response headers: legacy X-RateLimit-*, IETF draft RateLimit-Policy / RateLimit, and Retry-After rounding."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.http import HttpResponse

from ratelimit_app import Decision, Policy, PolicyResult
from ratelimit_app.apply.headers import (
    apply_headers,
    policy_field,
    ratelimit_field,
    retry_after_seconds,
    window_seconds,
)
from tests.support.limits_support import parse_ietf

FREE = (
    Policy("burst", "token_bucket", limit=20, period=60, burst=10),
    Policy("minute", "sliding_window", limit=20, period=60),
    Policy("day", "fixed_window", limit=1000, period=86400),
)
RESULTS = (
    PolicyResult("burst", False, 10, 0, 29.2, 2.1),
    PolicyResult("minute", True, 20, 10, 59.5, None),
    PolicyResult("day", True, 1000, 990, 40000.01, None),
)
DENIED = Decision.from_results(RESULTS)


def test_policy_field_names_quota_and_window() -> None:
    assert parse_ietf(policy_field(FREE)) == {
        "burst": {"q": 10, "w": 30},  # a bucket of 10 refilling 20/min is empty-to-full in 30 s
        "minute": {"q": 20, "w": 60},
        "day": {"q": 1000, "w": 86400},
    }
    assert policy_field(FREE).startswith('"burst";q=10;w=30, "minute"')


def test_window_of_each_algorithm() -> None:
    assert window_seconds(Policy("g", "gcra", limit=1, period=1, burst=5)) == 5
    assert window_seconds(Policy("c", "sliding_window_counter", limit=100, period=3600)) == 3600
    assert window_seconds(Policy("s", "fixed_window", limit=5, period=0.5)) == 1


def test_ratelimit_field_has_remaining_and_whole_seconds_to_reset() -> None:
    assert parse_ietf(ratelimit_field(RESULTS)) == {
        "burst": {"r": 0, "t": 30}, "minute": {"r": 10, "t": 60}, "day": {"r": 990, "t": 40001},
    }


@pytest.mark.parametrize(("mode", "legacy", "ietf"), [("both", True, True), ("legacy", True, False),
                                                      ("ietf", False, True)])
def test_modes(mode: str, legacy: bool, ietf: bool) -> None:
    response = HttpResponse()
    apply_headers(response, DENIED, FREE, "free", mode)
    assert ("X-RateLimit-Limit" in response) is legacy and ("X-RateLimit-Tier" in response) is legacy
    assert ("RateLimit" in response) is ietf and ("RateLimit-Policy" in response) is ietf
    if legacy:
        assert (response["X-RateLimit-Limit"], response["X-RateLimit-Remaining"], response["X-RateLimit-Reset"],
                response["X-RateLimit-Tier"]) == ("10", "0", "30", "free")


def test_degraded_decisions_send_no_counts() -> None:
    response = HttpResponse()
    apply_headers(response, Decision(True, 0, 0, 0.0, None, "", (), degraded=True), FREE, "free", "both")
    assert "X-RateLimit-Remaining" not in response and "RateLimit" not in response
    assert response["X-RateLimit-Tier"] == "free" and "RateLimit-Policy" in response


@pytest.mark.parametrize(("retry_after", "header"), [
    (0.001, 1), (0.5, 1), (1.0, 1), (1.001, 2), (59.2, 60), (None, 1), (math.inf, 1),
])
def test_retry_after_is_whole_seconds_rounded_up_at_least_one(retry_after: Any, header: Any) -> None:
    assert retry_after_seconds(retry_after) == header
