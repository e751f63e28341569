"""RATELIMIT['BACKEND'] = "memory": the limiter's state kept in this process (the in-process limiter with
`app_servers=1`), for test suites without Redis. One store per key prefix, kept for the life of the process
so a settings change finds the state it left, as it would in Redis; `forget(prefix)` drops one. Each
process counts alone (ratelimit.W040)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..core.decision import Decision
from ..core.engine import Check
from ..core.policies import Policy
from .fallback import LocalLimiter


class MemoryLimiter(LocalLimiter):
    """The in-process limiter of one key prefix, with the engine's `prefix` attribute."""

    def __init__(self, prefix: str) -> None:
        super().__init__(app_servers=1)
        self.prefix = prefix


class AsyncMemoryLimiter:
    """A MemoryLimiter for the async service: the same calls, awaitable (none of them does I/O, so they
    run right on the event loop)."""

    def __init__(self, limiter: MemoryLimiter) -> None:
        self.limiter = limiter
        self.prefix = limiter.prefix

    async def hit_many(self, checks: Sequence[Check], cost: int = 1, *, lease: str | None = None,
                       clock_shift_ms: int = 0) -> list[Decision]:
        return self.limiter.hit_many(checks, cost, lease=lease, clock_shift_ms=clock_shift_ms)

    async def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
                   clock_shift_ms: int = 0) -> Decision:
        return self.limiter.peek(identity, policies, cost, clock_shift_ms=clock_shift_ms)

    async def release(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        self.limiter.release(held, lease)

    async def renew(self, held: Sequence[tuple[str, Policy]], lease: str, lease_ms: int | None = None) -> int:
        return self.limiter.renew(held, lease, lease_ms)

    async def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        self.limiter.reset(identity, policies)


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
