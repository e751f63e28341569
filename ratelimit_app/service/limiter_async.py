"""The limiter service for asyncio code: `get_async_limiter()`, the twin of `get_limiter()`.

`AsyncLimiterService` has the methods of `LimiterService` (ratelimit_app.service.limiter), in the same
order, awaited, around the same `RedisGuard` (ratelimit_app.service.guard): `get_async_limiter()` shares
the guard of the service `get_limiter()` returns, so sync and async code of one process see one breaker
and one deny cache: a denial cached by a sync view is answered to an async view without Redis, and an
outage noticed by either opens the breaker for both.

What differs is the I/O: the engine is an `AsyncRateLimiter` (one per event loop: a redis.asyncio client
belongs to one loop), and the time budget (RATELIMIT['BUDGET_MS']) is one asyncio timeout around the
whole Redis call (connecting, EVALSHA, NOSCRIPT recovery, a cluster's topology refresh, a Sentinel
lookup). When it runs out the call is cancelled, its connection closed, and the fail mode answers; the
event loop is never blocked, so other requests are served meanwhile. A call cancelled from outside (the
client went away) is not counted as a Redis failure: the cancellation goes on up.
"""

from __future__ import annotations

import asyncio
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..conf.settings import SettingsCached, ratelimit_settings
from ..core.budget import within_budget
from ..core.decision import Decision
from ..core.engine import Check, Usage
from ..core.engine_async import AsyncRateLimiter, close_client
from ..core.exceptions import BACKEND_ERRORS, BackendError
from ..core.policies import Policy
from ..core.usage import NO_RESERVATION, Reservation, reservation
from . import clock
from .connection import get_async_redis
from .guard import RedisGuard
from .limiter import get_limiter
from .memory import AsyncMemoryLimiter, memory_limiter
from .servicecall import ServiceStats

#: What decides: the async engine over Redis, or this process' own limiter (the memory backend).
AsyncEngine = AsyncRateLimiter | AsyncMemoryLimiter

if sys.version_info >= (3, 11):
    from asyncio import timeout as _budget
else:  # redis-py depends on async-timeout below Python 3.11.3
    from async_timeout import timeout as _budget

# Redis could not decide: the engine's errors, or the budget's timeout (asyncio.TimeoutError is the
# built-in TimeoutError from Python 3.11 on, an OSError; before, a class of its own).
_FAILURES: tuple[type[Exception], ...] = (*BACKEND_ERRORS, asyncio.TimeoutError)


class AsyncLimiterService:
    """The async engine as request-handling code sees it, behind a RedisGuard (see LimiterService).

    `limiter` is an AsyncRateLimiter (or an AsyncMemoryLimiter), or a callable that builds one (called
    on first use in each event loop); None builds one per event loop from settings (RATELIMIT['BACKEND']).
    `guard` and `options` as for LimiterService.
    """

    def __init__(self, limiter: AsyncEngine | Callable[[], AsyncEngine] | None = None, *,
                 guard: RedisGuard | None = None, **options: Any) -> None:
        self.guard = RedisGuard.shared_or_new(guard, options)
        self._engine: AsyncEngine | None = None
        self._build: Callable[[], AsyncEngine]
        if isinstance(limiter, (AsyncRateLimiter, AsyncMemoryLimiter)):
            self._engine = limiter
            self._build = lambda: limiter
        elif limiter is None:
            prefix = ratelimit_settings.KEY_PREFIX
            self._build = (lambda: AsyncMemoryLimiter(memory_limiter(prefix))) if ratelimit_settings.BACKEND == \
                "memory" else (lambda: AsyncRateLimiter(get_async_redis(), prefix=prefix))
        else:
            self._build = limiter
        # one engine per event loop, dropped with its loop
        self._engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncEngine] = (
            weakref.WeakKeyDictionary())

    # -- the public API ----------------------------------------------------------------------------
    def limiter(self) -> AsyncEngine:
        """The engine for the running event loop (built on its first use there)."""
        if self._engine is not None:
            return self._engine
        loop = asyncio.get_running_loop()
        engine = self._engines.get(loop)
        if engine is None:
            engine = self._engines[loop] = self._build()
        return engine

    async def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
                  fail_mode: str | None = None, lease: str | None = None) -> Decision:
        """Charge `cost` to every policy if all allow (see LimiterService.hit)."""
        return (await self._decide([(identity, policies)], cost, fail_mode, charge=True, lease=lease))[0]

    async def hit_many(self, checks: Sequence[Check], cost: int = 1, *,
                       fail_mode: str | None = None, lease: str | None = None) -> list[Decision]:
        """Decide several identities together (see LimiterService.hit_many)."""
        return await self._decide(checks, cost, fail_mode, charge=True, lease=lease)

    async def reserve_many(self, checks: Sequence[Check], cost: int, usage: Usage, *, fail_mode: str | None = None,
                           lease: str | None = None) -> tuple[list[Decision], Reservation]:
        """`hit_many` with usage estimates reserved (see LimiterService.reserve_many)."""
        started = time.monotonic()
        decisions = await self._decide(checks, cost, fail_mode, charge=True, fresh=True, lease=lease, usage=usage)
        engine = self._engine or self._engines.get(asyncio.get_running_loop())
        if not isinstance(engine, AsyncRateLimiter) or any(decision.degraded for decision in decisions):
            return decisions, NO_RESERVATION
        return decisions, reservation(engine.prefix, checks, usage, started, clock.offset_ms(), decisions)

    async def settle(self, reservation: Reservation, used: Mapping[str, int]) -> bool:
        """Settle what a request reserved (see LimiterService.settle)."""
        guard = self.guard
        if not reservation.held:
            return True
        step = guard.step()
        if step is None:
            return False
        try:
            async with _budget(guard.budget):
                await self.limiter().settle(reservation, used)  # type: ignore[union-attr]
        except _FAILURES as exc:
            guard.count_failure(step, exc)
            return False
        except BaseException:
            guard.abandoned(step)
            raise
        guard.succeeded(step)
        return True

    async def release(self, held: Sequence[tuple[str, Policy]], lease: str, *, local: bool = False) -> bool:
        """Give back the concurrency slots of `held` taken under `lease` (see LimiterService.release)."""
        guard = self.guard
        if local:
            guard.fallback.release(held, lease)
            return True
        step = guard.step()
        if step is None:
            guard.release_failed(held, lease)
            return False
        try:
            async with _budget(guard.budget):
                await self.limiter().release(held, lease)
        except _FAILURES as exc:
            guard.count_failure(step, exc)
            guard.release_failed(held, lease)
            return False
        except BaseException:
            guard.abandoned(step)
            raise
        guard.succeeded(step)
        return True

    async def renew(self, held: Sequence[tuple[str, Policy]], lease: str, lease_ms: int | None = None, *,
                    local: bool = False) -> bool | None:
        """Make the slots of `held` taken under `lease` end `lease_ms` from now, or a full period from now
        (see LimiterService.renew): True, False (a lease had ended) or None (Redis not asked)."""
        guard = self.guard
        if local:
            guard.fallback.renew(held, lease, lease_ms)
            return True
        step = guard.step()
        if step is None:
            return None
        try:
            async with _budget(guard.budget):
                live = await self.limiter().renew(held, lease, lease_ms)
        except _FAILURES as exc:
            guard.count_failure(step, exc)
            return None
        except BaseException:
            guard.abandoned(step)
            raise
        guard.succeeded(step)
        return live == len(held)

    async def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
                   fail_mode: str | None = None, fresh: bool = False) -> Decision:
        """Report what `hit` would decide, charging nothing (see LimiterService.peek)."""
        return (await self._decide([(identity, policies)], cost, fail_mode, charge=False, fresh=fresh))[0]

    async def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies (see LimiterService.reset); raises
        BackendError when Redis cannot do it within the budget."""
        guard = self.guard
        guard.forget_locally(identity, policies)
        try:
            async with _budget(guard.budget):
                engine = self.limiter()
                await engine.reset(identity, policies)
                if isinstance(engine, AsyncRateLimiter):  # after the delete: see ResetWatch
                    await guard.reset_watch(engine.prefix).announce(engine.client)
        except asyncio.TimeoutError as exc:
            raise BackendError(f"could not reset {identity!r:.80}: the time budget ran out",
                               maybe_applied=True) from exc

    def stats(self) -> ServiceStats:
        """A snapshot of the guard's counters (shared with the sync service of this process)."""
        return self.guard.stats()

    async def aclose(self) -> None:
        """Close the engine this service built for the running event loop (its connections and its
        client), if any."""
        engine = self._engines.pop(asyncio.get_running_loop(), None)
        if isinstance(engine, AsyncRateLimiter):
            await engine.aclose()
            await close_client(engine.client)

    # -- one decision ------------------------------------------------------------------------------
    async def _decide(self, checks: Sequence[Check], cost: int, fail_mode: str | None, *,
                      charge: bool, fresh: bool = False, lease: str | None = None, usage: Usage = ()) -> list[Decision]:
        guard = self.guard
        engine = self._engine or self._engines.get(asyncio.get_running_loop())
        watched = engine.prefix if isinstance(engine, AsyncRateLimiter) else None  # (as LimiterService._decide)
        call = guard.open(checks, cost, fail_mode, charge, fresh, watched, lease)
        if call.watch is not None and isinstance(engine, AsyncRateLimiter):
            try:
                async with _budget(guard.budget):
                    epoch = await engine.client.get(call.watch.key)
            except _FAILURES:
                guard.epoch_read(call, None, failed=True)
            else:
                guard.epoch_read(call, epoch)
        if call.answer is not None:
            return call.answer
        # the engine's own connections wait for a reply without a timer of their own when this one ends first
        try:
            with within_budget(guard.budget):
                async with _budget(guard.budget):
                    engine = self.limiter()
                    if charge:
                        reserving = {"usage": usage} if usage and isinstance(engine, AsyncRateLimiter) else {}
                        decisions = await engine.hit_many(checks, cost, lease=lease, clock_shift_ms=clock.offset_ms(),
                                                          **reserving)
                    else:
                        identity, policies = checks[0]
                        decisions = [await engine.peek(identity, policies, cost, clock_shift_ms=clock.offset_ms())]
        except _FAILURES as exc:
            return guard.failed(call, exc)
        except BaseException as exc:
            guard.abandoned_call(call, exc)
            raise
        return guard.answered(call, decisions)


_service = SettingsCached(lambda: AsyncLimiterService(guard=get_limiter().guard))


def get_async_limiter() -> AsyncLimiterService:
    """The async limiter service for this process, sharing its guard with `get_limiter()` (created on
    first use, rebuilt after every settings change). Await its methods from any event loop."""
    return _service.get()
