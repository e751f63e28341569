"""DRF's own throttling tests, run against our drop-ins.

`test_drf_throttling.py` runs DRF's `tests/test_throttling.py`, unchanged, fetched from DRF's sdist at
test time (upstream.py: the pinned version, hash-checked). Before it is imported,
`rest_framework.throttling`'s `AnonRateThrottle`, `UserRateThrottle` and `ScopedRateThrottle` are
replaced by ours, so every test of that file that names them runs ours; the originals are put back once
collection ends. The suite runs in its own pytest
process with DRF's default settings, as DRF's own suite does (tests/drf_suite/settings.py):

    ./scripts/test tests/drf_suite --ds=tests.drf_suite.settings

Each test runs against our real Redis under a fresh key prefix that the suite's `key_prefix` fixture
empties afterwards (DRF's `cache.clear()` clears a local-memory cache, never the shared Redis).

The tests that move DRF's clock by replacing `timer` cannot pass against a limiter whose clock is
Redis TIME: they are expected to fail (strict, so one that starts passing is reported), and
tests/test_drf_compat.py shows the same behaviour of ours with real time.
"""

from __future__ import annotations

from typing import Any

import pytest
import rest_framework.throttling as drf_throttling
from django.conf import settings as django_settings

from ratelimit_app import throttling

if django_settings.SETTINGS_MODULE != "tests.drf_suite.settings":
    raise pytest.UsageError("DRF's throttling suite runs with DRF's defaults: add --ds=tests.drf_suite.settings")

_REPLACED = ("AnonRateThrottle", "UserRateThrottle", "ScopedRateThrottle")
_ORIGINALS = {name: getattr(drf_throttling, name) for name in _REPLACED}
for _name in _REPLACED:
    setattr(drf_throttling, _name, getattr(throttling, _name))

#: DRF tests that fake DRF's clock (`timer`), and the test of ours that shows the behaviour with real time.
FAKE_CLOCK = {
    "test_request_throttling_expires": "test_a_refused_client_is_allowed_again_once_the_window_passed",
    "test_request_throttling_multiple_throttles": "test_stacked_drop_ins_see_every_request_in_one_decision",
    "test_throttle_rate_change_negative": "test_a_rate_changed_on_the_class_applies_to_the_next_request",
    "test_next_rate_remains_constant_if_followed": "test_a_client_that_follows_the_rate_is_never_refused",
    "test_scoped_rate_throttle": "test_scopes_count_apart_and_reset_after_their_window",
}


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    for item in items:
        name = getattr(item, "originalname", item.name)
        if "drf_suite" in str(item.path) and name in FAKE_CLOCK:
            item.add_marker(pytest.mark.xfail(
                strict=True, reason=f"fakes DRF's clock (timer); tests/test_drf_compat.py::{FAKE_CLOCK[name]}",
            ))


def pytest_collection_finish(session: pytest.Session) -> None:
    for name, original in _ORIGINALS.items():
        setattr(drf_throttling, name, original)

