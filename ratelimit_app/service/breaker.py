"""A circuit breaker in front of Redis: after `failures` consecutive failures it opens and decisions skip Redis;
after the cool-down one probe goes through, closing it or reopening it with the cool-down doubled (up to
`max_cooldown`). States and reports: docs/operations.md, "The circuit breaker"."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.logs import log_event

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

#: What `before_call` tells the caller to do.
CALL = 0  # call Redis (breaker closed)
PROBE = 1  # call Redis as the single probe; report the outcome with probe=True
SKIP = 2  # do not call Redis; follow the fail mode


@dataclass(frozen=True)
class BreakerState:
    """A snapshot of the breaker: `retry_in` is seconds until the next probe may run (0 when closed or
    probing); `cooldown` the one it opened with or will open with next; `opened` how many times it has
    opened (from closed)."""

    state: str
    consecutive_failures: int
    cooldown: float
    retry_in: float
    opened: int


class CircuitBreaker:
    """Thread-safe circuit breaker (the closed-state fast paths take no lock). `clock` returns monotonic
    seconds (public, so a test can move time). Each state change is reported once: to `on_change(state,
    detail)` (`detail`: the previous state, and the failure count, error and cool-down where they apply;
    it must not raise), else logged as "ratelimit.breaker"."""

    def __init__(self, failures: int, cooldown: float, max_cooldown: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        if failures < 1:
            raise ValueError(f"failures: {failures!r} must be at least 1")
        if cooldown <= 0 or max_cooldown < cooldown:
            raise ValueError(f"cooldown: need 0 < cooldown ({cooldown!r}) <= max_cooldown ({max_cooldown!r})")
        self.failures = failures
        self.base_cooldown = float(cooldown)
        self.max_cooldown = float(max_cooldown)
        self.clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self.state = CLOSED
        self._consecutive = 0
        self._cooldown = self.base_cooldown
        self._open_until = 0.0
        self._opened_at = 0.0
        self._probe_started = 0.0
        self._opened = 0

    def before_call(self) -> int:
        """CALL, PROBE or SKIP: whether this caller may use Redis now."""
        if self.state is CLOSED:
            return CALL
        now = self.clock()
        with self._lock:
            if self.state is CLOSED:
                return CALL
            if self.state is OPEN:
                if now < self._open_until:
                    return SKIP
                self.state = HALF_OPEN
                self._probe_started = now
                changed = True
            else:
                # half-open: one probe is in flight. A probe that never reported back (its caller
                # died) must not keep the breaker half-open forever.
                if now - self._probe_started < self.max_cooldown:
                    return SKIP
                self._probe_started = now
                changed = False
        if changed:
            self._changed(HALF_OPEN, {"previous": OPEN})
        return PROBE

    def record_success(self, probe: bool = False) -> None:
        """Redis answered: reset the failure count; close the breaker if it was not closed."""
        if self.state is CLOSED and self._consecutive == 0:
            return
        with self._lock:
            self._consecutive = 0
            if self.state is CLOSED:
                return
            outage = self.clock() - self._opened_at
            previous = self.state
            self.state = CLOSED
            self._cooldown = self.base_cooldown
        self._changed(CLOSED, {"previous": previous, "outage_seconds": round(outage, 3)})

    def record_failure(self, error: object = None, probe: bool = False) -> None:
        """Redis failed or timed out: count it; open (or re-open after a failed probe) when due."""
        now = self.clock()
        with self._lock:
            if self.state is CLOSED:
                self._consecutive += 1
                if self._consecutive < self.failures:
                    return
                self.state = OPEN
                self._opened += 1
                self._opened_at = now
                self._cooldown = self.base_cooldown
                self._open_until = now + self._cooldown
                reopened = False
            elif probe and self.state is HALF_OPEN:
                self._cooldown = min(self._cooldown * 2, self.max_cooldown)
                self.state = OPEN
                self._open_until = now + self._cooldown
                reopened = True
            else:
                # a call that started before the breaker opened: already accounted for
                return
            cooldown, consecutive = self._cooldown, self._consecutive
        self._changed(OPEN, {"previous": HALF_OPEN if reopened else CLOSED, "failures": consecutive,
                             "error": str(error)[:200], "error_class": _error_class(error),
                             "next_probe_seconds": cooldown})

    def abandon_probe(self) -> None:
        """The probe ended without asking Redis (bad input): let the next caller probe at once."""
        with self._lock:
            if self.state is HALF_OPEN:
                self.state = OPEN
                self._open_until = self.clock()

    def retry_in(self) -> float:
        """Seconds until the breaker lets a probe through (0 when closed or half-open)."""
        if self.state is not OPEN:
            return 0.0
        return max(self._open_until - self.clock(), 0.0)

    def snapshot(self) -> BreakerState:
        """The current state, for stats."""
        with self._lock:
            return BreakerState(self.state, self._consecutive, self._cooldown, self.retry_in(), self._opened)

    def _changed(self, state: str, detail: dict[str, Any]) -> None:
        if self._on_change is not None:
            self._on_change(state, detail)
        else:
            log_event("ratelimit.breaker", logging.WARNING if state == OPEN else logging.INFO, state=state, **detail)


def _error_class(error: object) -> str:
    """The class name of the exception behind `error` (the Redis error a BackendError chains), "" for none."""
    if error is None:
        return ""
    return type(getattr(error, "__cause__", None) or error).__name__
