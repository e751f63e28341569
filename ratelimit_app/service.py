"""The process-wide limiter service: what the middleware, throttles, decorator and commands call.

`get_limiter()` returns a `LimiterService`: the engine (`RateLimiter`) configured from settings,
plus the policies of this process around it (failure handling when Redis is slow or down).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from .conf import on_reload, ratelimit_settings
from .connection import get_redis
from .decision import Decision
from .engine import RateLimiter
from .policies import Policy


class LimiterService:
    """The engine as request-handling code sees it.

    `fail_mode` ("open", "closed", "local" or None for RATELIMIT['FAIL_MODE']) chooses what a call
    answers when Redis cannot: see docs/operations.md. A decision made without Redis has
    `degraded=True`; a degraded denial (`allowed=False, degraded=True`) means "refused because the
    limiter is unavailable" and is answered with 503, not 429.
    """

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
            fail_mode: str | None = None) -> Decision:
        """Charge `cost` to every policy if all allow (see RateLimiter.hit)."""
        return self.hit_many([(identity, policies)], cost, fail_mode=fail_mode)[0]

    def hit_many(self, checks: Sequence[tuple[str, Sequence[Policy]]], cost: int = 1, *,
                 fail_mode: str | None = None) -> list[Decision]:
        """Decide several identities together (see RateLimiter.hit_many)."""
        return self.limiter.hit_many(checks, cost)

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Report what `hit` would decide, charging nothing (see RateLimiter.peek)."""
        return self.limiter.peek(identity, policies, cost)

    def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies."""
        self.limiter.reset(identity, policies)


_lock = threading.Lock()
_service: LimiterService | None = None


def get_limiter() -> LimiterService:
    """The limiter service for this process, configured from settings.RATELIMIT (created on first use)."""
    global _service
    service = _service
    if service is None:
        with _lock:
            if _service is None:
                _service = LimiterService(RateLimiter(get_redis(), prefix=ratelimit_settings.KEY_PREFIX))
            service = _service
    return service


@on_reload
def reset_limiter() -> None:
    """Forget the service so the next use builds one from the current settings."""
    global _service
    with _lock:
        _service = None
