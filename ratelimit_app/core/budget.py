"""The limiter's time budget: the deadline of the running limiter call, set around each call (`start_budget`,
`end_budget`) and read by what waits for Redis (`time_left`, `reply_wait`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar, Token

# The monotonic time (time.monotonic()) by which the running limiter call must be answered, or None
# outside a budget.
_deadline: ContextVar[float | None] = ContextVar("ratelimit_budget_deadline", default=None)


def start_budget(seconds: float, start: float | None = None) -> Token[float | None]:
    """Every Redis connect and reply wait from now on waits at most for what is left of `seconds` (from `start`,
    a time.monotonic() value, default now), until `end_budget(token)`. Nested budgets are not combined."""
    return _deadline.set((time.monotonic() if start is None else start) + seconds)


#: End the budget `start_budget` started, given the token it returned.
end_budget: Callable[[Token[float | None]], None] = _deadline.reset


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
