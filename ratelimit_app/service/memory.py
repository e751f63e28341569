"""RATELIMIT['BACKEND'] = "memory": the limiter's state kept in this process (the in-process limiter with
`app_servers=1`), for test suites without Redis. One store per key prefix, kept for the life of the process
so a settings change finds the state it left, as it would in Redis; `forget(prefix)` drops one. Each
process counts alone (ratelimit.W040)."""

from __future__ import annotations

import threading

from .fallback import LocalLimiter


class MemoryLimiter(LocalLimiter):
    """The in-process limiter of one key prefix, with the engine's `prefix` attribute."""

    def __init__(self, prefix: str) -> None:
        super().__init__(app_servers=1)
        self.prefix = prefix


_stores: dict[str, MemoryLimiter] = {}
_lock = threading.Lock()


def memory_limiter(prefix: str) -> MemoryLimiter:
    """The store of `prefix` in this process (made on first use)."""
    with _lock:
        limiter = _stores.get(prefix)
        if limiter is None:
            limiter = _stores[prefix] = MemoryLimiter(prefix)
        return limiter


def forget(prefix: str) -> None:
    """Drop the store of `prefix`, and every state in it."""
    with _lock:
        _stores.pop(prefix, None)
