"""The limiter's time budget: the deadline of the running limiter call, set around each call (`within_budget`)
and read by what waits for Redis (`time_left`, `reply_wait`)."""

from __future__ import annotations

import time
from contextvars import ContextVar, Token

# The monotonic time (time.monotonic()) by which the running limiter call must be answered, or None
# outside a budget.
_deadline: ContextVar[float | None] = ContextVar("ratelimit_budget_deadline", default=None)


class within_budget:
    """`with within_budget(seconds):` every Redis connect and reply wait inside waits at most for what is
    left of `seconds` (from `start`, a time.monotonic() value, default now). Nested budgets are not
    combined: the inner one applies until it ends. `start_budget` and `end_budget` do the same without a
    context manager (the services, around each Redis call of theirs)."""

    __slots__ = ("_deadline", "_token")

    def __init__(self, seconds: float, start: float | None = None) -> None:
        self._deadline = (time.monotonic() if start is None else start) + seconds

    def __enter__(self) -> None:
        self._token = _deadline.set(self._deadline)

    def __exit__(self, *exc: object) -> None:
        _deadline.reset(self._token)


def start_budget(seconds: float, start: float | None = None) -> Token[float | None]:
    """Start the budget `within_budget(seconds, start)` sets; `end_budget(token)` ends it."""
    return _deadline.set((time.monotonic() if start is None else start) + seconds)


def end_budget(token: Token[float | None]) -> None:
    _deadline.reset(token)


def time_left() -> float | None:
    """Seconds left in the running budget (<= 0 once it ran out), or None outside a budget."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def reply_wait(read_timeout: float | None) -> float | None:
    """How long a connection without a socket timeout of its own (AsyncRateLimiter's own connections)
    waits for a reply: `read_timeout`, or None, no timer of its own, when the running budget ends first
    anyway (the async service's timeout around the call ends the wait): one timer per decision, not two."""
    if read_timeout is not None:
        left = time_left()
        if left is not None and left <= read_timeout:
            return None
    return read_timeout
