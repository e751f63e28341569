"""The limiter's clock shift, for tests: milliseconds added to the time of every decision of this process
(`advance`, which the test kit's `ratelimit.advance` calls), passed to Redis and to the in-process limiter
with each decision. Only while RATELIMIT['CLOCK_SHIFT'] is allowed (docs/testing.md, "Moving the clock");
it drops back to 0 when the settings no longer allow it."""

from __future__ import annotations

import math
import threading

from django.core.exceptions import ImproperlyConfigured

from ..conf.settings import clock_shift_allowed, on_reload, read_settings
from ..core.engine import MAX_CLOCK_SHIFT_MS

_lock = threading.Lock()
_offset_ms = 0


def offset_ms() -> int:
    """The shift in milliseconds (0 unless a test moved the clock): what each decision passes along."""
    return _offset_ms


def advance(seconds: float) -> int:
    """Move the limiter's clock `seconds` forward (a number >= 0; milliseconds rounded up) and return the
    whole shift in milliseconds. Raises ImproperlyConfigured when RATELIMIT['CLOCK_SHIFT'] does not
    allow it, ValueError for a bad number or a shift beyond ten years."""
    global _offset_ms
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
        raise ValueError(f"seconds: {seconds!r} must be a number of seconds >= 0")
    values, _ = read_settings()
    if not clock_shift_allowed(values):
        raise ImproperlyConfigured(
            "the limiter's clock moves only in tests: set RATELIMIT['CLOCK_SHIFT'] = True (the test kit's "
            "`ratelimit` fixture and RateLimitTestMixin do), with DEBUG on or under a test runner")
    with _lock:
        shifted = _offset_ms + math.ceil(seconds * 1000)
        if shifted > MAX_CLOCK_SHIFT_MS:
            raise ValueError(f"seconds: the clock would move {shifted} ms, more than ten years")
        _offset_ms = shifted
    return shifted


def reset() -> None:
    """Put the clock back: decisions are made at Redis' own time again."""
    global _offset_ms
    with _lock:
        _offset_ms = 0


@on_reload
def _drop_when_no_longer_allowed() -> None:
    values, errors = read_settings()
    if errors or not clock_shift_allowed(values):
        reset()
