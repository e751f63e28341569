"""The vendored DRF tests really run our throttles (see conftest.py)."""

from __future__ import annotations

from ratelimit_app import throttling

from . import test_throttling as drf_tests


def test_drf_tests_use_our_drop_ins() -> None:
    assert drf_tests.AnonRateThrottle is throttling.AnonRateThrottle
    assert drf_tests.UserRateThrottle is throttling.UserRateThrottle
    assert drf_tests.ScopedRateThrottle is throttling.ScopedRateThrottle
    assert issubclass(drf_tests.User3SecRateThrottle, throttling.AtomicRateThrottle)
