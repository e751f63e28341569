"""The process-wide limiter service: `get_limiter()`, what request handling and the commands call.

`LimiterService` is the engine (`RateLimiter`, or this process' own limiter with RATELIMIT['BACKEND'] =
"memory") behind the process' `RedisGuard`: it drives the guard's steps, making each Redis call they ask
for within the time budget. Its twin for asyncio code is `AsyncLimiterService` (limiter_async.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..conf.settings import SettingsCached, ratelimit_settings
from ..core.budget import within_budget
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


class LimiterService:
    """The engine as request-handling code sees it, behind the process' RedisGuard.

    `limiter` is a RateLimiter (or a MemoryLimiter), or a callable that builds one (called lazily,
    inside the time budget, and again after a failure: a Redis Cluster that is down when the process
    starts is not fatal); None builds one from settings (RATELIMIT['BACKEND']). `guard` is the RedisGuard
    to decide behind (None: a new one, built from `options`: fail_mode, budget_ms, app_servers, breaker,
    deny_cache_size, fallback; see RedisGuard).

    `fail_mode` ("open", "closed", "local", or None for the guard's) chooses what a call answers when
    Redis cannot (see RedisGuard.degraded). Invalid arguments (an unknown fail mode, a bad cost or
    policy) raise ValueError/TypeError.
    """

    def __init__(self, limiter: _Engine | Callable[[], _Engine] | None = None, *,
                 guard: RedisGuard | None = None, **options: Any) -> None:
        self.guard = RedisGuard.shared_or_new(guard, options)
        self._engine: _Engine | None = None
        self._build: Callable[[], _Engine]
        if isinstance(limiter, (RateLimiter, MemoryLimiter)):
            self._engine = limiter
            self._build = lambda: limiter
        elif limiter is None:
            prefix, connections = ratelimit_settings.KEY_PREFIX, ratelimit_settings.CONNECTIONS
            self._build = (lambda: memory_limiter(prefix)) if ratelimit_settings.BACKEND == "memory" else (
                lambda: RateLimiter(get_redis(), prefix=prefix, connections=connections))
        else:
            self._build = limiter
        self._build_lock = threading.Lock()
        self.guard.settle_with(self._drive)  # lost leases are settled through this service

    # -- the public API ----------------------------------------------------------------------------
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
        """Charge `cost` to every policy if all allow (see RateLimiter.hit); the fail mode applies
        when Redis cannot decide within the budget. `lease` as in `hit_many`."""
        return self._drive(self.guard.decide(self._engine, [(identity, policies)], cost, fail_mode, True,
                                             lease=lease))[0]

    def hit_many(self, checks: Sequence[Check], cost: int = 1, *,
                 fail_mode: str | None = None, lease: str | None = None) -> list[Decision]:
        """Decide several identities together (see RateLimiter.hit_many); the fail mode applies to
        all of them when Redis cannot decide within the budget. Concurrency slots are taken under
        `lease` (in Redis, or in the local fallback when the decision is local: `release` with the
        same `local`)."""
        return self._drive(self.guard.decide(self._engine, checks, cost, fail_mode, True, lease=lease))

    def reserve_many(self, checks: Sequence[Check], cost: int, usage: Usage, *, fail_mode: str | None = None,
                     lease: str | None = None) -> tuple[list[Decision], Reservation]:
        """`hit_many`, each usage limit of `checks` charged the estimate of its unit in `usage` (see
        RateLimiter.reserve), with what `settle` needs: nothing when refused or decided without Redis (the
        fail mode, the memory backend). The deny cache is not read: an estimate's refusal says nothing of
        another estimate's, and a settlement may give back units at any moment."""
        started = time.monotonic()
        decisions = self._drive(self.guard.decide(self._engine, checks, cost, fail_mode, True, fresh=True,
                                                  lease=lease, usage=usage))
        engine = self._engine
        if not isinstance(engine, RateLimiter) or any(decision.degraded for decision in decisions):
            return decisions, NO_RESERVATION
        return decisions, reservation(engine.prefix, checks, usage, started, clock.offset_ms(), decisions)

    def settle(self, reservation: Reservation, used: Mapping[str, int]) -> bool:
        """Settle what a request reserved at the units it `used` (see RateLimiter.settle), within the time
        budget and through the breaker; False when Redis could not be asked (the estimate stays charged)."""
        return self._drive(self.guard.settle(reservation, used))

    def release(self, held: Sequence[tuple[str, Policy]], lease: str, *, local: bool = False) -> bool:
        """Give back the concurrency slots of `held` taken under `lease`: in Redis (one round trip,
        within the time budget, through the breaker), or in the local fallback when `local` (the
        decision that took them was made by the "local" fail mode). Never raises for Redis failures:
        False when Redis could not be asked; the release is then sent again once Redis answers
        (RedisGuard.release_failed), unless the lease has run out by then."""
        return self._drive(self.guard.release(held, lease, local))

    def renew(self, held: Sequence[tuple[str, Policy]], lease: str, lease_ms: int | None = None, *,
              local: bool = False) -> bool | None:
        """Make the slots of `held` taken under `lease` end `lease_ms` from now (at most each policy's
        period), or a full period from now (None): in Redis (within the time budget, through the breaker;
        see RateLimiter.renew), or in the local fallback when `local`. True when every slot was still
        held, False when the lease of one had ended (given back, cancelled or run out: it is not taken
        again), None when Redis could not be asked (never raises for it: the slots keep the end they had).
        Slots the "local" fail mode took live in the process that took them, which a renewal may not
        reach: it is True for them."""
        return self._drive(self.guard.renew(held, lease, lease_ms, local))

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
             fail_mode: str | None = None, fresh: bool = False) -> Decision:
        """Report what `hit` would decide, charging nothing (see RateLimiter.peek); the fail mode
        applies when Redis cannot answer. `fresh` skips the deny cache (whose counts are those of the
        moment Redis denied): a report of where a client stands now."""
        return self._drive(self.guard.decide(self._engine, [(identity, policies)], cost, fail_mode, False,
                                             fresh=fresh))[0]

    def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies: in Redis, in this process' deny cache and
        in the local fallback; other processes drop their cached denials within RESET_CHECK_INTERVAL
        (the reset epoch, see ratelimit_app.service.denycache). Raises BackendError or a RedisError when
        Redis cannot be reached (the local state is forgotten anyway)."""
        self._drive(self.guard.reset(identity, policies))

    def call_redis(self, command: Callable[[Any], T]) -> T:
        """`command(client)`: one small command of the caller's own (a GET or SET of a marker key) on the
        engine's Redis client, within the time budget. Not a decision: it neither counts as one nor moves
        the breaker. Raises BackendError without sending anything while the breaker is not closed (Redis
        is known to be failing) or when there is no Redis (the memory backend), and what the client raises
        (BACKEND_ERRORS) when Redis cannot answer."""
        return self._drive(self.guard.command(command))

    def stats(self) -> ServiceStats:
        """A snapshot of the guard's counters (shared with the async service of this process)."""
        return self.guard.stats()

    # -- the I/O of the guard's steps ---------------------------------------------------------------
    def _drive(self, steps: Steps[T]) -> T:
        """Carry out the guard's steps: each Redis call they ask for, within the time budget; what they
        return (see AsyncLimiterService._drive, its twin)."""
        budget = self.guard.budget
        reply: Any = None
        failure: BaseException | None = None
        try:
            while True:
                run, started = steps.send(reply) if failure is None else steps.throw(failure)
                failure = None
                try:
                    with within_budget(budget, started):
                        reply = run(self.limiter())
                except BaseException as exc:  # the steps decide what it means
                    failure = exc
        except StopIteration as done:
            return done.value


_service = SettingsCached(LimiterService)


def get_limiter() -> LimiterService:
    """The limiter service for this process, configured from settings.RATELIMIT (created on first use,
    rebuilt after every settings change)."""
    return _service.get()
