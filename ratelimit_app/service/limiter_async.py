"""The limiter service for asyncio code, `get_async_limiter()`: the twin of `get_limiter()`, sharing its
`RedisGuard`, with an engine per event loop and each Redis call under one asyncio timeout of what is left
of the budget (docs/operations.md, "The async service")."""

from __future__ import annotations

import asyncio
import inspect
import sys
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from ..conf.settings import SettingsCached, ratelimit_settings
from ..core.budget import end_budget, start_budget
from ..core.decision import Decision
from ..core.engine import Check, Usage
from ..core.engine_async import AsyncRateLimiter
from ..core.policies import Policy
from ..core.redispy import close_client
from ..core.usage import Reservation
from .connection import get_async_redis
from .guard import RedisGuard
from .limiter import ServiceBase, get_limiter
from .memory import MemoryLimiter, memory_limiter
from .servicecall import Steps, T

#: What decides: the async engine over Redis, or this process' own limiter (the memory backend, whose calls do
#: no I/O: their replies are not awaited).
_AsyncEngine = AsyncRateLimiter | MemoryLimiter

if sys.version_info >= (3, 11):
    from asyncio import timeout as _budget
else:  # redis-py depends on async-timeout below Python 3.11.3
    from async_timeout import timeout as _budget


class AsyncLimiterService(ServiceBase[_AsyncEngine]):
    """The async engine (an AsyncRateLimiter or MemoryLimiter) behind a RedisGuard: the methods of
    LimiterService, awaited. A callable `limiter` is called on first use in each event loop; None builds
    an engine per event loop from settings (see ServiceBase)."""

    _engine_types = (AsyncRateLimiter, MemoryLimiter)

    def __init__(self, limiter: _AsyncEngine | Callable[[], _AsyncEngine] | None = None, *,
                 guard: RedisGuard | None = None, **options: Any) -> None:
        super().__init__(limiter, guard, options)
        # one engine per event loop, dropped with its loop
        self._engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AsyncEngine] = (
            weakref.WeakKeyDictionary())

    def _from_settings(self) -> Callable[[], _AsyncEngine]:
        prefix = ratelimit_settings.KEY_PREFIX
        if ratelimit_settings.BACKEND == "memory":
            return lambda: memory_limiter(prefix)
        return lambda: AsyncRateLimiter(get_async_redis(), prefix=prefix)

    def limiter(self) -> _AsyncEngine:
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
        return (await self._drive(self.guard.decide(self._built(), [(identity, policies)], cost, fail_mode, True,
                                                    lease=lease)))[0]

    async def hit_many(self, checks: Sequence[Check], cost: int = 1, *,
                       fail_mode: str | None = None, lease: str | None = None) -> list[Decision]:
        """Decide several identities together (see LimiterService.hit_many)."""
        return await self._drive(self.guard.decide(self._built(), checks, cost, fail_mode, True, lease=lease))

    async def reserve_many(self, checks: Sequence[Check], cost: int, usage: Usage, *, fail_mode: str | None = None,
                           lease: str | None = None) -> tuple[list[Decision], Reservation]:
        """`hit_many` with usage estimates reserved (see LimiterService.reserve_many)."""
        started = time.monotonic()
        decisions = await self._drive(self.guard.decide(self._built(), checks, cost, fail_mode, True, fresh=True,
                                                        lease=lease, usage=usage))
        return self._reserved(self._built(), checks, usage, started, decisions)

    async def settle(self, reservation: Reservation, used: Mapping[str, int]) -> bool:
        """Settle what a request reserved (see LimiterService.settle)."""
        return await self._drive(self.guard.settle(reservation, used))

    async def release(self, held: Sequence[tuple[str, Policy]], lease: str, *, local: bool = False) -> bool:
        """Give back the concurrency slots of `held` taken under `lease` (see LimiterService.release)."""
        return await self._drive(self.guard.release(held, lease, local))

    async def renew(self, held: Sequence[tuple[str, Policy]], lease: str, lease_ms: int | None = None, *,
                    local: bool = False) -> bool | None:
        """Make the slots of `held` taken under `lease` end `lease_ms` from now, or a full period from now
        (see LimiterService.renew): True, False (a lease had ended) or None (Redis not asked)."""
        return await self._drive(self.guard.renew(held, lease, lease_ms, local))

    async def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
                   fail_mode: str | None = None, fresh: bool = False) -> Decision:
        """Report what `hit` would decide, charging nothing (see LimiterService.peek)."""
        return (await self._drive(self.guard.decide(self._built(), [(identity, policies)], cost, fail_mode, False,
                                                    fresh=fresh)))[0]

    async def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies (see LimiterService.reset); raises
        BackendError when Redis cannot do it within the budget."""
        await self._drive(self.guard.reset(identity, policies))

    async def call_redis(self, command: Callable[[Any], Awaitable[T]]) -> T:
        """`await command(client)` on the engine's redis.asyncio client, within the time budget (see
        LimiterService.call_redis)."""
        return cast(T, await self._drive(self.guard.command(command)))

    async def aclose(self) -> None:
        """Close the engine this service built for the running event loop (its connections and its
        client), if any."""
        engine = self._engines.pop(asyncio.get_running_loop(), None)
        if isinstance(engine, AsyncRateLimiter):
            await engine.aclose()
            await close_client(engine.client)

    def _built(self) -> _AsyncEngine | None:
        """The engine of the running event loop, if built yet (the guard reads no reset epoch before)."""
        return self._engine or self._engines.get(asyncio.get_running_loop())

    async def _drive(self, steps: Steps[T]) -> T:
        """Carry out the guard's steps (LimiterService._drive's twin, awaited): each Redis call they ask for
        under one asyncio timeout of the time left in the budget, so the event loop is never blocked; a
        call cancelled from outside is thrown into the steps like a failure, which they let go on up."""
        budget = self.guard.budget
        reply: Any = None
        failure: BaseException | None = None
        try:
            while True:
                run, started = steps.send(reply) if failure is None else steps.throw(failure)
                left = budget if started is None else started + budget - time.monotonic()
                # the engine's own connections wait with no timer of theirs when this one ends first (reply_wait)
                deadline = start_budget(budget, started)
                try:
                    async with _budget(left):
                        reply = run(self.limiter())
                        reply, failure = await reply if inspect.isawaitable(reply) else reply, None
                except BaseException as exc:  # the steps decide what it means
                    reply, failure = None, exc
                finally:
                    end_budget(deadline)
        except StopIteration as done:
            return done.value


_service = SettingsCached(lambda: AsyncLimiterService(guard=get_limiter().guard))


def get_async_limiter() -> AsyncLimiterService:
    """The async limiter service for this process, sharing its guard with `get_limiter()` (created on
    first use, rebuilt after every settings change). Await its methods from any event loop."""
    return _service.get()
