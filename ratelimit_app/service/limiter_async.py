"""The limiter service for asyncio code: `get_async_limiter()`, the async counterpart of `get_limiter()`.

`AsyncLimiterService` answers like `LimiterService` (ratelimit_app.service.limiter) and shares with it
everything but the I/O: the fail modes, the circuit breaker, the deny cache, the local fallback, the
counters of `stats()` and the metrics, and the code that decides around the Redis call
(`LimiterService._open`, `_answered`, `_failed`, `_abandoned`). `get_async_limiter()` wraps the very
service `get_limiter()` returns, so sync and async code of one process see one breaker and one deny
cache: a denial cached by a sync view is answered to an async view without Redis, and an outage
noticed by either opens the breaker for both.

What differs is the I/O: the engine is an `AsyncRateLimiter`, and the time budget
(RATELIMIT['BUDGET_MS']) is one asyncio timeout around the whole Redis call (connecting, EVALSHA,
NOSCRIPT recovery, a cluster's topology refresh, a Sentinel lookup). When it runs out the call is
cancelled, its connection closed, and the fail mode answers; the event loop is never blocked, so
other requests are served meanwhile.
"""

from __future__ import annotations

import asyncio
import sys
import time
import weakref
from collections.abc import Callable, Sequence

from ..core.budget import budget_deadline
from ..core.decision import Decision
from ..core.engine import Check
from ..core.engine_async import AsyncRateLimiter, close_client
from ..core.exceptions import BACKEND_ERRORS, BackendError
from ..core.policies import Policy
from .breaker import PROBE, SKIP, CircuitBreaker
from .conf import SettingsCached, ratelimit_settings
from .connection import get_async_redis
from .fallback import LocalLimiter
from .limiter import LimiterService, get_limiter
from .servicecall import ServiceStats

if sys.version_info >= (3, 11):
    from asyncio import timeout as _budget
else:  # redis-py depends on async-timeout below Python 3.11.3
    from async_timeout import timeout as _budget

# Redis could not decide: the engine's errors, or the budget's timeout (asyncio.TimeoutError is the
# built-in TimeoutError from Python 3.11 on, an OSError; before, a class of its own).
_FAILURES: tuple[type[Exception], ...] = (*BACKEND_ERRORS, asyncio.TimeoutError)


class AsyncLimiterService:
    """The async engine as request-handling code sees it, with the failure handling of LimiterService.

    `service` is the LimiterService whose state and settings this one shares (the fail mode, the
    budget, the breaker, the deny cache, the fallback, the counters); None builds a new one from the
    other arguments, which mean what they mean for LimiterService. `limiter` is an AsyncRateLimiter,
    or a callable that builds one (called on first use in each event loop: a redis.asyncio client
    belongs to one loop); None builds one per event loop from settings.

    `hit`, `hit_many` and `peek` answer like LimiterService's, awaited; a decision made without Redis
    has `degraded=True`. A call cancelled from outside (the client went away) is not counted as a
    Redis failure: the cancellation goes on up.
    """

    def __init__(self, limiter: AsyncRateLimiter | Callable[[], AsyncRateLimiter] | None = None, *,
                 service: LimiterService | None = None, fail_mode: str | None = None,
                 budget_ms: float | None = None, app_servers: int | None = None,
                 breaker: CircuitBreaker | None = None, deny_cache_size: int | None = None,
                 fallback: LocalLimiter | None = None) -> None:
        options = (fail_mode, budget_ms, app_servers, breaker, deny_cache_size, fallback)
        if service is not None and any(option is not None for option in options):
            raise TypeError("service: give either a LimiterService to share or the options of a new one, not both")
        self.service = service or LimiterService(fail_mode=fail_mode, budget_ms=budget_ms, app_servers=app_servers,
                                                 breaker=breaker, deny_cache_size=deny_cache_size, fallback=fallback)
        self._engine: AsyncRateLimiter | None = None
        self._build: Callable[[], AsyncRateLimiter]
        if isinstance(limiter, AsyncRateLimiter):
            self._engine = limiter
            self._build = lambda: limiter
        elif limiter is None:
            prefix = ratelimit_settings.KEY_PREFIX
            self._build = lambda: AsyncRateLimiter(get_async_redis(), prefix=prefix)
        else:
            self._build = limiter
        # one engine per event loop, dropped with its loop
        self._engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRateLimiter] = (
            weakref.WeakKeyDictionary())

    # -- the public API ----------------------------------------------------------------------------
    async def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
                  fail_mode: str | None = None, lease: str | None = None) -> Decision:
        """Charge `cost` to every policy if all allow (see RateLimiter.hit); the fail mode applies
        when Redis cannot decide within the budget. `lease` as in `hit_many`."""
        return (await self._decide([(identity, policies)], cost, fail_mode, charge=True, lease=lease))[0]

    async def hit_many(self, checks: Sequence[Check], cost: int = 1, *,
                       fail_mode: str | None = None, lease: str | None = None) -> list[Decision]:
        """Decide several identities together (see RateLimiter.hit_many); the fail mode applies to
        all of them when Redis cannot decide within the budget. Concurrency slots are taken under
        `lease` (see LimiterService.hit_many; give them back with `release`)."""
        return await self._decide(checks, cost, fail_mode, charge=True, lease=lease)

    async def release(self, held: Sequence[tuple[str, Policy]], lease: str, *, local: bool = False) -> bool:
        """Give back the concurrency slots of `held` taken under `lease` (see LimiterService.release):
        in Redis within the budget and through the shared breaker, or in the local fallback when
        `local`. Never raises for Redis failures: False when Redis could not be asked (the slots then
        free themselves when their lease runs out)."""
        service = self.service
        if local:
            service.fallback.release(held, lease)
            return True
        step = service.breaker.before_call()
        if step == SKIP:
            return False
        try:
            async with _budget(service.budget):
                await (self._engine or self.limiter()).release(held, lease)
        except _FAILURES as exc:
            service._count_failure()
            service.breaker.record_failure(exc, probe=step == PROBE)
            return False
        except BaseException:
            if step == PROBE:
                service.breaker.abandon_probe()
            raise
        service.breaker.record_success(probe=step == PROBE)
        return True

    async def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
                   fail_mode: str | None = None, fresh: bool = False) -> Decision:
        """Report what `hit` would decide, charging nothing; the fail mode applies when Redis cannot
        answer within the budget. `fresh` skips the deny cache (see LimiterService.peek)."""
        return (await self._decide([(identity, policies)], cost, fail_mode, charge=False, fresh=fresh))[0]

    async def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies (see LimiterService.reset); raises
        BackendError when Redis cannot do it within the budget."""
        service = self.service
        service._forget_locally(identity, policies)
        try:
            async with _budget(service.budget):
                engine = self.limiter()
                await engine.reset(identity, policies)
                # after the delete: see ratelimit_app.service.denycache.ResetWatch
                await service._reset_watch(engine.prefix).announce(engine.client)
        except asyncio.TimeoutError as exc:
            raise BackendError(f"could not reset {identity!r:.80}: the time budget ran out",
                               maybe_applied=True) from exc

    def stats(self) -> ServiceStats:
        """A snapshot of the counters, shared with the sync service (see LimiterService.stats)."""
        return self.service.stats()

    def limiter(self) -> AsyncRateLimiter:
        """The engine for the running event loop (built on its first use there)."""
        if self._engine is not None:
            return self._engine
        loop = asyncio.get_running_loop()
        engine = self._engines.get(loop)
        if engine is None:
            engine = self._engines[loop] = self._build()
        return engine

    async def aclose(self) -> None:
        """Close the engine this service built for the running event loop (its connections and its
        client), if any."""
        engine = self._engines.pop(asyncio.get_running_loop(), None)
        if engine is not None:
            await engine.aclose()
            await close_client(engine.client)

    # -- one decision ------------------------------------------------------------------------------
    async def _decide(self, checks: Sequence[Check], cost: int, fail_mode: str | None, *,
                      charge: bool, fresh: bool = False, lease: str | None = None) -> list[Decision]:
        service = self.service
        engine = self._engine or self._engines.get(asyncio.get_running_loop())
        call = service._open(checks, cost, fail_mode, charge, fresh, engine.prefix if engine is not None else None,
                             lease)
        if call.watch is not None and engine is not None:
            try:
                async with _budget(service.budget):
                    epoch = await engine.client.get(call.watch.key)
            except _FAILURES:
                service._epoch_read(call, None, failed=True)
            else:
                service._epoch_read(call, epoch)
        if call.answer is not None:
            return call.answer
        # the engine's own connections wait for a reply without a timer of their own when this one ends first
        token = budget_deadline.set(time.monotonic() + service.budget)
        try:
            async with _budget(service.budget):
                engine = self._engine or self.limiter()
                if charge:
                    decisions = await engine.hit_many(checks, cost, lease=lease)
                else:
                    identity, policies = checks[0]
                    decisions = [await engine.peek(identity, policies, cost)]
        except _FAILURES as exc:
            return service._failed(call, exc)
        except BaseException:
            service._abandoned(call)
            raise
        finally:
            budget_deadline.reset(token)
        return service._answered(call, decisions)


_service = SettingsCached(lambda: AsyncLimiterService(service=get_limiter()))


def get_async_limiter() -> AsyncLimiterService:
    """The async limiter service for this process, sharing its state with `get_limiter()` (created on
    first use, rebuilt after every settings change). Await its methods from any event loop."""
    return _service.get()
