"""The process-wide limiter service, `get_limiter()`: the engine behind the process' `RedisGuard`, as request
handling and the commands call it. Its asyncio twin is `AsyncLimiterService` (limiter_async.py); both only
drive the guard's steps (docs/operations.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

from ..conf.settings import SettingsCached, ratelimit_settings
from ..core.budget import end_budget, start_budget
from ..core.decision import Decision
from ..core.engine import Check, Usage
from ..core.engine_sync import RateLimiter
from ..core.policies import Policy
from ..core.usage import NO_RESERVATION, Reservation, reservation
from . import clock
from .connection import get_redis
from .guard import RedisGuard
from .memory import MemoryLimiter, memory_limiter
from .servicecall import ServiceStats, Steps, T

#: What decides: the engine over Redis, or this process' own limiter (RATELIMIT['BACKEND'] = "memory").
_Engine = RateLimiter | MemoryLimiter
E = TypeVar("E")


class ServiceBase(Generic[E]):
    """What the sync and the async service share: their guard, and the engine or what builds it.

    `limiter` is an engine, or a callable that builds one (lazily, inside the time budget, and again
    after a failure: a Redis Cluster that is down when the process starts is not fatal); None builds one
    from settings (RATELIMIT['BACKEND']). `guard` is the RedisGuard to decide behind (None: a new one,
    built from `options`: fail_mode, budget_ms, app_servers, breaker, deny_cache_size, fallback). Invalid
    arguments (an unknown fail mode, a bad cost or policy) raise ValueError/TypeError.
    """

    _engine_types: tuple[type, ...]

    def __init__(self, limiter: E | Callable[[], E] | None, guard: RedisGuard | None,
                 options: dict[str, Any]) -> None:
        self.guard = RedisGuard.shared_or_new(guard, options)
        self._engine: E | None = None
        self._build: Callable[[], E]
        if isinstance(limiter, self._engine_types):
            engine = self._engine = cast(E, limiter)
            self._build = lambda: engine
        else:
            self._build = self._from_settings() if limiter is None else cast(Callable[[], E], limiter)

    def _from_settings(self) -> Callable[[], E]:
        raise NotImplementedError

    def stats(self) -> ServiceStats:
        """A snapshot of the guard's counters (shared by the sync and the async service of this process)."""
        return self.guard.stats()

    @staticmethod
    def _reserved(engine: Any, checks: Sequence[Check], usage: Usage, started: float,
                  decisions: list[Decision]) -> tuple[list[Decision], Reservation]:
        """`decisions` with what `settle` needs: nothing when refused or decided without Redis (the fail
        mode, the memory backend)."""
        if getattr(engine, "client", None) is None or any(decision.degraded for decision in decisions):
            return decisions, NO_RESERVATION
        return decisions, reservation(engine.prefix, checks, usage, started, clock.offset_ms(), decisions)


class LimiterService(ServiceBase[_Engine]):
    """The engine (a RateLimiter or MemoryLimiter) as request-handling code sees it, behind the process'
    RedisGuard (see ServiceBase for the arguments). `fail_mode` ("open", "closed", "local", or None for
    the guard's) chooses what a call answers when Redis cannot (see RedisGuard.degraded)."""

    _engine_types = (RateLimiter, MemoryLimiter)

    def __init__(self, limiter: _Engine | Callable[[], _Engine] | None = None, *,
                 guard: RedisGuard | None = None, **options: Any) -> None:
        super().__init__(limiter, guard, options)
        self._build_lock = threading.Lock()
        self.guard.settle_with(self._drive)  # lost leases are settled through this service

    def _from_settings(self) -> Callable[[], _Engine]:
        prefix, connections = ratelimit_settings.KEY_PREFIX, ratelimit_settings.CONNECTIONS
        if ratelimit_settings.BACKEND == "memory":
            return lambda: memory_limiter(prefix)
        return lambda: RateLimiter(get_redis(), prefix=prefix, connections=connections)

    def limiter(self) -> _Engine:
        """The engine (built on first use; raises what building it raises)."""
        if self._engine is not None:
            return self._engine
        with self._build_lock:
            if self._engine is None:
                self._engine = self._build()
            return self._engine

    def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
            fail_mode: str | None = None, lease: str | None = None) -> Decision:
        """Charge `cost` to every policy if all allow (see RateLimiter.hit); `lease` as in `hit_many`."""
        return self._drive(self.guard.decide(self._engine, [(identity, policies)], cost, fail_mode, True,
                                             lease=lease))[0]

    def hit_many(self, checks: Sequence[Check], cost: int = 1, *,
                 fail_mode: str | None = None, lease: str | None = None) -> list[Decision]:
        """Decide several identities together (see RateLimiter.hit_many). Concurrency slots are taken
        under `lease` (in Redis, or in the local fallback when the decision is local: `release` with the
        same `local`)."""
        return self._drive(self.guard.decide(self._engine, checks, cost, fail_mode, True, lease=lease))

    def reserve_many(self, checks: Sequence[Check], cost: int, usage: Usage, *, fail_mode: str | None = None,
                     lease: str | None = None) -> tuple[list[Decision], Reservation]:
        """`hit_many`, each usage limit of `checks` charged the estimate of its unit in `usage` (see
        RateLimiter.reserve), with what `settle` needs. The deny cache is not read: an estimate's refusal
        says nothing of another estimate's, and a settlement may give back units at any moment."""
        started = time.monotonic()
        decisions = self._drive(self.guard.decide(self._engine, checks, cost, fail_mode, True, fresh=True,
                                                  lease=lease, usage=usage))
        return self._reserved(self._engine, checks, usage, started, decisions)

    def settle(self, reservation: Reservation, used: Mapping[str, int]) -> bool:
        """Settle what a request reserved at the units it `used` (see RateLimiter.settle); False when Redis
        could not be asked (the estimate stays charged)."""
        return self._drive(self.guard.settle(reservation, used))

    def release(self, held: Sequence[tuple[str, Policy]], lease: str, *, local: bool = False) -> bool:
        """Give back the concurrency slots of `held` taken under `lease`: in Redis, or in the local fallback
        when `local` (the "local" fail mode took them). False when Redis could not be asked (never raises
        for it): the release is sent again once Redis answers, unless the lease has run out by then."""
        return self._drive(self.guard.release(held, lease, local))

    def renew(self, held: Sequence[tuple[str, Policy]], lease: str, lease_ms: int | None = None, *,
              local: bool = False) -> bool | None:
        """Make the slots of `held` taken under `lease` end `lease_ms` from now (at most each policy's
        period), or a full period from now (None); see RateLimiter.renew. True when every slot was still
        held, False when the lease of one had ended (it is not taken again), None when Redis could not be
        asked (the slots keep their end). Slots the "local" fail mode took are True."""
        return self._drive(self.guard.renew(held, lease, lease_ms, local))

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
             fail_mode: str | None = None, fresh: bool = False) -> Decision:
        """Report what `hit` would decide, charging nothing (see RateLimiter.peek). `fresh` skips the deny
        cache (whose counts are those of the moment Redis denied)."""
        return self._drive(self.guard.decide(self._engine, [(identity, policies)], cost, fail_mode, False,
                                             fresh=fresh))[0]

    def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies: in Redis, in every process' deny cache (see
        ratelimit_app.service.denycache) and in the local fallback. Raises BackendError or a RedisError
        when Redis cannot be reached (the local state is forgotten anyway)."""
        self._drive(self.guard.reset(identity, policies))

    def call_redis(self, command: Callable[[Any], T]) -> T:
        """`command(client)`: one small command of the caller's own on the engine's Redis client, within the
        time budget; not a decision (it neither counts as one nor moves the breaker). Raises BackendError
        without sending anything while the breaker is not closed or when there is no Redis (the memory
        backend), and what the client raises (BACKEND_ERRORS) when Redis cannot answer."""
        return self._drive(self.guard.command(command))

    def _drive(self, steps: Steps[T]) -> T:
        """Carry out the guard's steps: each Redis call they ask for, within the time budget."""
        reply: Any = None
        failure: BaseException | None = None
        try:
            while True:
                run, started = steps.send(reply) if failure is None else steps.throw(failure)
                budget = start_budget(self.guard.budget, started)
                try:
                    reply, failure = run(self.limiter()), None
                except BaseException as exc:  # the steps decide what it means
                    reply, failure = None, exc
                finally:
                    end_budget(budget)
        except StopIteration as done:
            return done.value


_service = SettingsCached(LimiterService)


def get_limiter() -> LimiterService:
    """The limiter service for this process, configured from settings.RATELIMIT (created on first use,
    rebuilt after every settings change)."""
    return _service.get()
