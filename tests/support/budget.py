"""`within_budget`: the limiter's time budget over a block, set and reset as the services set it around each
Redis call (ratelimit_app.core.budget's `start_budget` / `end_budget`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ratelimit_app.core.budget import end_budget, start_budget


@contextmanager
def within_budget(seconds: float, start: float | None = None) -> Iterator[None]:
    token = start_budget(seconds, start)
    try:
        yield
    finally:
        end_budget(token)
