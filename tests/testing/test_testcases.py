"""RateLimitTestMixin: a Django TestCase whose tests each get limiter state of their own (`self.ratelimit`),
run by unittest's own runner."""

from __future__ import annotations

import io
import unittest

import pytest
from django.test import TestCase

from ratelimit_app.conf import settings as conf
from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.service import clock
from ratelimit_app.testing import IsolatedRateLimit, RateLimitTestMixin, assert_limited, assert_not_limited
from tests.support.limits_support import make_key, make_tier


def mixin_tests(seen: list[str]) -> type[TestCase]:
    """A project's TestCase written with the mixin (made here, so that pytest does not collect it itself)."""

    class QuotaTests(RateLimitTestMixin, TestCase):
        def setUp(self) -> None:
            super().setUp()
            make_tier("hourly", [("hour", "sliding_window", 1, 3600, None, "")])
            self.key = make_key("hourly")

        def test_a_refusal_then_the_clock_moves_past_it(self) -> None:
            assert isinstance(self.ratelimit, IsolatedRateLimit)
            seen.append(self.ratelimit.prefix)
            assert ratelimit_settings.KEY_PREFIX == self.ratelimit.prefix
            assert_not_limited(self.client.get("/api/users", HTTP_X_API_KEY=self.key))
            assert_limited(self.client.get("/api/users", HTTP_X_API_KEY=self.key), policy="hour")
            self.ratelimit.advance(3600)
            assert_not_limited(self.client.get("/api/users", HTTP_X_API_KEY=self.key))

        def test_each_test_starts_afresh(self) -> None:
            seen.append(self.ratelimit.prefix)
            assert clock.offset_ms() == 0
            assert_not_limited(self.client.get("/api/users", HTTP_X_API_KEY=self.key))
            self.ratelimit.disable()
            assert_not_limited(self.client.get("/api/users", HTTP_X_API_KEY=self.key))

    return QuotaTests


@pytest.mark.django_db
def test_each_test_of_a_testcase_has_its_own_state_and_leaves_nothing_laid_over() -> None:
    seen: list[str] = []
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(mixin_tests(seen))
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    assert result.wasSuccessful(), result.failures + result.errors
    assert result.testsRun == 2 and len(set(seen)) == 2
    assert conf.set_overlay({}) == {} and clock.offset_ms() == 0
