"""The limiter's clock shift (ratelimit_app.service.clock): passed with every decision of the sync and
async services, to Redis and to the local fail mode's limiter, and honoured only while the settings
allow it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from ratelimit_app import Policy
from ratelimit_app.core.engine import MAX_CLOCK_SHIFT_MS
from ratelimit_app.service import clock
from ratelimit_app.service.limiter import get_limiter
from ratelimit_app.service.limiter_async import get_async_limiter

HOUR = Policy("hour", "fixed_window", limit=1, period=3600)


@pytest.fixture
def movable(settings: Any) -> Iterator[None]:
    settings.RATELIMIT = {**settings.RATELIMIT, "CLOCK_SHIFT": True}
    yield
    clock.reset()


def test_the_services_decide_on_the_shifted_clock_in_redis(movable: None) -> None:
    service = get_limiter()
    assert service.hit("c", [HOUR]).allowed
    assert not service.hit("c", [HOUR]).allowed
    assert clock.advance(3600) == 3_600_000
    assert service.peek("c", [HOUR]).allowed
    assert asyncio.run(get_async_limiter().hit("c", [HOUR])).allowed  # the async service passes it too
    assert not service.hit("c", [HOUR]).allowed  # the shifted hour is used now


def test_the_local_fail_mode_decides_on_the_shifted_clock_too(settings: Any, movable: None) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": "redis://127.0.0.1:1/0", "FAIL_MODE": "local"}
    service = get_limiter()
    first = service.hit("c", [HOUR])
    assert first.allowed and first.degraded  # decided in process: Redis is unreachable
    assert not service.hit("c", [HOUR]).allowed
    clock.advance(3600)
    assert service.hit("c", [HOUR]).allowed


def test_the_shift_is_whole_milliseconds_rounded_up_and_at_most_ten_years(movable: None) -> None:
    assert clock.advance(0.0001) == 1
    assert clock.advance(0) == 1
    for bad in (-0.001, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ValueError, match="seconds"):
            clock.advance(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="more than ten years"):
        clock.advance(MAX_CLOCK_SHIFT_MS / 1000)
    assert clock.offset_ms() == 1


def test_the_shift_drops_back_when_the_settings_stop_allowing_it(settings: Any, movable: None) -> None:
    clock.advance(60)
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": "5/m"}  # still allowed: the shift stays
    assert clock.offset_ms() == 60_000
    settings.RATELIMIT = {**settings.RATELIMIT, "CLOCK_SHIFT": False}
    assert clock.offset_ms() == 0
