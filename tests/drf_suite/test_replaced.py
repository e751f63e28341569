"""The fetched DRF tests really run our throttles (see conftest.py), from the pinned DRF sdist."""

from __future__ import annotations

from pathlib import Path

from ratelimit_app import throttling

from .upstream import DRF_VERSION, drf_throttling_tests


def test_drf_tests_use_our_drop_ins() -> None:
    drf_tests = drf_throttling_tests()
    assert drf_tests.AnonRateThrottle is throttling.AnonRateThrottle
    assert drf_tests.UserRateThrottle is throttling.UserRateThrottle
    assert drf_tests.ScopedRateThrottle is throttling.ScopedRateThrottle
    assert issubclass(drf_tests.User3SecRateThrottle, throttling.AtomicRateThrottle)


def test_the_tests_come_from_drfs_sdist_not_from_this_repository() -> None:
    assert not Path(__file__).with_name("test_throttling.py").exists()
    assert Path(drf_throttling_tests().__file__ or "").read_text().startswith('"""\nTests for the throttling')
    assert DRF_VERSION.count(".") == 2
