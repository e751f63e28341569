"""`RateLimitTestMixin`: the test kit for unittest and Django's TestCase."""

from __future__ import annotations

from typing import Any

from .state import IsolatedRateLimit


class RateLimitTestMixin:
    """Give each test of a TestCase limiter state of its own: `self.ratelimit`, an IsolatedRateLimit
    (`advance`, `reset`, `disable`, `enable`, `prefix`), started before `setUp`'s body and stopped after
    the test, its cleanups included. List it before the TestCase class:

        class QuotaTests(RateLimitTestMixin, TestCase): ...
    """

    ratelimit: IsolatedRateLimit

    def setUp(self) -> None:
        self.ratelimit = IsolatedRateLimit().start()
        self.addCleanup(self.ratelimit.stop)
        super().setUp()  # type: ignore[misc]

    def addCleanup(self, function: Any, /, *args: Any, **kwargs: Any) -> None:  # (unittest's, typed here)
        super().addCleanup(function, *args, **kwargs)  # type: ignore[misc]
