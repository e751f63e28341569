"""The process-wide limiter built from settings: what the middleware, throttles and decorator call."""

from __future__ import annotations

import threading

from .conf import on_reload, ratelimit_settings
from .connection import get_redis
from .engine import RateLimiter

_lock = threading.Lock()
_limiter: RateLimiter | None = None


def get_limiter() -> RateLimiter:
    """The limiter for this process, configured from settings.RATELIMIT (created on first use)."""
    global _limiter
    limiter = _limiter
    if limiter is None:
        with _lock:
            if _limiter is None:
                _limiter = RateLimiter(get_redis(), prefix=ratelimit_settings.KEY_PREFIX)
            limiter = _limiter
    return limiter


@on_reload
def reset_limiter() -> None:
    """Forget the limiter so the next use builds one from the current settings."""
    global _limiter
    with _lock:
        _limiter = None
