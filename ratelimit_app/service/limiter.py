"""The process-wide limiter service: what the middleware, throttles, decorator and commands call.

`get_limiter()` returns a `LimiterService`: the engine (`RateLimiter`) configured from settings, plus
what keeps the API serving when Redis is slow or down (docs/operations.md tells the whole story):

- a time budget (RATELIMIT['BUDGET_MS']): every connect and read of one decision waits at most for
  what is left of it (see ratelimit_app.service.connection), so no request hangs on Redis;
- a circuit breaker (ratelimit_app.service.breaker): after BREAKER_FAILURES consecutive failures, decisions
  skip Redis until a single probe finds it answering again;
- fail modes for decisions Redis cannot make: "open" (allow, degraded), "closed" (refuse, degraded:
  HTTP 503 with Retry-After) or "local" (the in-process limiter of ratelimit_app.service.fallback, each
  policy divided by APP_SERVERS);
- a local deny cache (ratelimit_app.service.denycache): a request Redis denied until T is denied in process
  until T, without a Redis call; a reset in any process clears it everywhere within
  RESET_CHECK_INTERVAL (the deny cache reads the reset epoch at most that often, see ResetWatch).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..core.budget import budget_deadline
from ..core.decision import Decision, degraded_decision
from ..core.engine import Check, prepare_call
from ..core.engine_sync import RateLimiter
from ..core.exceptions import BACKEND_ERRORS
from ..core.policies import CONCURRENCY, Policy
from . import events
from .breaker import CLOSED, PROBE, SKIP, CircuitBreaker
from .conf import SettingsCached, ratelimit_settings
from .connection import get_redis
from .denycache import DenyCache, ResetWatch
from .fallback import LocalLimiter
from .logs import log_event
from .servicecall import ServiceCall, ServiceStats, request_key

FAIL_MODES = ("open", "closed", "local")

#: The answer of the "open" fail mode: allowed, made without Redis, nothing known about the limits.
OPEN_DECISION = degraded_decision(True)


class LimiterService:
    """The engine as request-handling code sees it, with the failure handling described above.

    `limiter` is a RateLimiter, or a callable that builds one (called lazily, inside the time budget,
    and again after a failure: a Redis Cluster that is down when the process starts is not fatal);
    None builds one from settings. Every other argument defaults to its RATELIMIT setting, read once
    here (the service is rebuilt when settings change).

    `fail_mode` ("open", "closed", "local", or None for the service's default) chooses what a call
    answers when Redis cannot. A decision made without Redis has `degraded=True`; a degraded denial
    (`allowed=False, degraded=True`) means "refused because the limiter is unavailable" (HTTP 503 with
    Retry-After). In "local" mode a request over its local share is denied like any rate-limited
    request (`allowed=False, degraded=False`: HTTP 429); local admissions are `degraded=True`.
    Invalid arguments (an unknown fail mode, a bad cost or policy) raise ValueError/TypeError.
    """

    def __init__(self, limiter: RateLimiter | Callable[[], RateLimiter] | None = None, *,
                 fail_mode: str | None = None, budget_ms: float | None = None, app_servers: int | None = None,
                 breaker: CircuitBreaker | None = None, deny_cache_size: int | None = None,
                 fallback: LocalLimiter | None = None) -> None:
        settings = ratelimit_settings
        self.fail_mode = _check_mode(settings.FAIL_MODE if fail_mode is None else fail_mode)
        self.budget = float(settings.BUDGET_MS if budget_ms is None else budget_ms) / 1000.0
        if self.budget <= 0:
            raise ValueError(f"budget_ms: {budget_ms!r} must be > 0")
        self.breaker = breaker or CircuitBreaker(
            settings.BREAKER_FAILURES, settings.BREAKER_COOLDOWN, settings.BREAKER_MAX_COOLDOWN,
            on_change=self._breaker_changed,
        )
        self.deny_cache = DenyCache(settings.DENY_CACHE_SIZE if deny_cache_size is None else deny_cache_size)
        self.fallback = fallback or LocalLimiter(app_servers=settings.APP_SERVERS if app_servers is None
                                                 else app_servers)
        self._engine: RateLimiter | None = None
        self._build: Callable[[], RateLimiter]
        self._resets: ResetWatch | None = None  # built on first use (the engine's key prefix)
        if isinstance(limiter, RateLimiter):
            self._engine = limiter
            self._build = lambda: limiter
        elif limiter is None:
            prefix, connections = settings.KEY_PREFIX, settings.CONNECTIONS
            self._build = lambda: RateLimiter(get_redis(), prefix=prefix, connections=connections)
        else:
            self._build = limiter
        self._build_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._redis_failures = 0
        self._counts = {"open": 0, "closed": 0, "local_allowed": 0, "local_denied": 0}

    # -- the public API ----------------------------------------------------------------------------
    @property
    def limiter(self) -> RateLimiter:
        """The engine (built on first use; raises what building it raises)."""
        return self._engine or self._build_engine()

    def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
            fail_mode: str | None = None, lease: str | None = None) -> Decision:
        """Charge `cost` to every policy if all allow (see RateLimiter.hit); the fail mode applies
        when Redis cannot decide. `lease` as in `hit_many`."""
        return self._decide([(identity, policies)], cost, fail_mode, charge=True, lease=lease)[0]

    def hit_many(self, checks: Sequence[Check], cost: int = 1, *,
                 fail_mode: str | None = None, lease: str | None = None) -> list[Decision]:
        """Decide several identities together (see RateLimiter.hit_many); the fail mode applies to
        all of them when Redis cannot decide. Concurrency slots are taken under `lease` (in Redis, or
        in the local fallback when the decision is local: `release` with the same `local`)."""
        return self._decide(checks, cost, fail_mode, charge=True, lease=lease)

    def release(self, held: Sequence[tuple[str, Policy]], lease: str, *, local: bool = False) -> bool:
        """Give back the concurrency slots of `held` taken under `lease`: in Redis (one round trip,
        within the time budget, through the breaker), or in the local fallback when `local` (the
        decision that took them was made by the "local" fail mode). Never raises for Redis failures:
        False when Redis could not be asked (those slots then free themselves when their lease runs out)."""
        if local:
            self.fallback.release(held, lease)
            return True
        step = self.breaker.before_call()
        if step == SKIP:
            return False
        started = time.monotonic()
        token = budget_deadline.set(started + self.budget)
        try:
            (self._engine or self._build_engine()).release(held, lease)
        except BACKEND_ERRORS as exc:
            self._count_failure()
            self.breaker.record_failure(exc, probe=step == PROBE)
            return False
        except BaseException:
            if step == PROBE:
                self.breaker.abandon_probe()
            raise
        finally:
            budget_deadline.reset(token)
        self.breaker.record_success(probe=step == PROBE)
        return True

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
             fail_mode: str | None = None, fresh: bool = False) -> Decision:
        """Report what `hit` would decide, charging nothing (see RateLimiter.peek); the fail mode
        applies when Redis cannot answer. `fresh` skips the deny cache (whose counts are those of the
        moment Redis denied): a report of where a client stands now."""
        return self._decide([(identity, policies)], cost, fail_mode, charge=False, fresh=fresh)[0]

    def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies: in Redis, in this process' deny cache and
        in the local fallback; other processes drop their cached denials within RESET_CHECK_INTERVAL
        (the reset epoch, see ratelimit_app.service.denycache). Raises BackendError or a RedisError when Redis
        cannot be reached (the local state is forgotten anyway)."""
        self._forget_locally(identity, policies)
        token = budget_deadline.set(time.monotonic() + self.budget)
        try:
            engine = self.limiter
            engine.reset(identity, policies)
            self._reset_watch(engine.prefix).announce(engine.client)  # after the delete: see ResetWatch
        finally:
            budget_deadline.reset(token)

    def stats(self) -> ServiceStats:
        """A snapshot of this service's counters."""
        with self._stats_lock:
            counts = dict(self._counts)
            failures = self._redis_failures
        return ServiceStats(self.breaker.snapshot(), failures, counts["open"], counts["closed"],
                            counts["local_allowed"], counts["local_denied"], self.deny_cache.hits,
                            len(self.deny_cache), len(self.fallback))

    # -- one decision ------------------------------------------------------------------------------
    def _decide(self, checks: Sequence[Check], cost: int, fail_mode: str | None, *, charge: bool,
                fresh: bool = False, lease: str | None = None) -> list[Decision]:
        engine = self._engine
        call = self._open(checks, cost, fail_mode, charge, fresh, engine.prefix if engine is not None else None,
                          lease)
        if call.watch is not None:
            self._read_epoch(call)
        if call.answer is not None:
            return call.answer
        token = budget_deadline.set(call.started + self.budget)
        try:
            engine = self._engine or self._build_engine()
            if charge:
                decisions = engine.hit_many(checks, cost, lease=lease)
            else:
                identity, policies = checks[0]
                decisions = [engine.peek(identity, policies, cost)]
        except BACKEND_ERRORS as exc:
            return self._failed(call, exc)
        except BaseException:
            self._abandoned(call)
            raise
        finally:
            budget_deadline.reset(token)
        return self._answered(call, decisions)

    def _read_epoch(self, call: ServiceCall) -> None:
        """The reset epoch `_open` asked for, read over the sync engine's client within the budget."""
        watch, engine = call.watch, self._engine
        if watch is None or engine is None:  # _open asks only when there is an engine
            return
        token = budget_deadline.set(time.monotonic() + self.budget)
        try:
            epoch = engine.client.get(watch.key)
        except BACKEND_ERRORS:
            self._epoch_read(call, None, failed=True)
            return
        finally:
            budget_deadline.reset(token)
        self._epoch_read(call, epoch)

    # What happens around the Redis call, shared with the asyncio service (ratelimit_app.service.limiter_async):
    # _open before it (deny cache, breaker); when _open leaves `call.watch` set, the caller reads the
    # reset epoch and hands it to _epoch_read; then, when no answer is known yet, the caller asks Redis
    # and ends with exactly one of _answered, _failed or _abandoned. Only the I/O is the caller's.
    def _open(self, checks: Sequence[Check], cost: int, fail_mode: str | None, charge: bool, fresh: bool,
              prefix: str | None, lease: str | None = None) -> ServiceCall:
        """A call on its way to Redis, or with its `answer` already known (deny cache, breaker open).

        `prefix` is the key prefix of the caller's engine, None when it has none yet (the reset epoch
        is then not read). A cached denial comes with `call.watch` set when the reset epoch is due to
        be read first (see ResetWatch): the answer stands unless `_epoch_read` finds it changed.
        """
        mode = self.fail_mode if fail_mode is None else _check_mode(fail_mode)
        call = ServiceCall(checks, cost, mode, charge, lease)
        cache = self.deny_cache
        if len(cache) and not fresh:
            call.key = request_key(checks, cost)
            call.answer = cache.get(call.key, time.monotonic())
            if call.answer is not None:
                # never while the breaker is open; when Redis cannot answer, the cache keeps answering
                if prefix is not None and self.breaker.state == CLOSED:
                    watch = self._reset_watch(prefix)
                    if watch.due(time.monotonic()):
                        call.watch = watch
                return call
        return self._to_redis(call)

    def _epoch_read(self, call: ServiceCall, epoch: Any, failed: bool = False) -> ServiceCall:
        """The reset epoch was read (or could not be): keep the cached denial, unless some process
        announced a reset since this one last looked; then the deny cache is cleared and the call
        goes on to Redis."""
        watch, call.watch = call.watch, None
        if failed or watch is None or not watch.changed(epoch):
            return call
        self.deny_cache.clear()
        return self._to_redis(call)

    def _to_redis(self, call: ServiceCall) -> ServiceCall:
        call.answer = None
        call.generation = self.deny_cache.generation
        call.step = self.breaker.before_call()
        if call.step == SKIP:
            call.answer = self._degraded(call.mode, call.checks, call.cost, call.charge, call.lease)
        else:
            call.started = time.monotonic()
        return call

    def _answered(self, call: ServiceCall, decisions: list[Decision]) -> list[Decision]:
        """Redis decided: count the latency and the success; a denial goes into the deny cache, unless
        a concurrency slot refused it (a slot can free at any moment: a response finishes)."""
        events.observe_latency(time.monotonic() - call.started)
        self.breaker.record_success(probe=call.step == PROBE)
        if decisions and not decisions[-1].allowed and not _refused_for_slots(call.checks, decisions):
            self.deny_cache.remember(request_key(call.checks, call.cost) if call.key is None else call.key,
                                     tuple(identity for identity, _ in call.checks), decisions, call.started,
                                     call.generation)
        return decisions

    def _failed(self, call: ServiceCall, error: BaseException) -> list[Decision]:
        """Redis could not decide (an error, or the budget ran out): count it; the fail mode answers."""
        events.observe_latency(time.monotonic() - call.started)
        with self._stats_lock:
            self._redis_failures += 1
        self.breaker.record_failure(error, probe=call.step == PROBE)
        return self._degraded(call.mode, call.checks, call.cost, call.charge, call.lease)

    def _count_failure(self) -> None:
        """One more Redis call that failed or timed out (see stats)."""
        with self._stats_lock:
            self._redis_failures += 1

    def _abandoned(self, call: ServiceCall) -> None:
        """The call ended without an answer from Redis or a Redis failure (bad input, cancellation)."""
        if call.step == PROBE:
            self.breaker.abandon_probe()

    def _forget_locally(self, identity: str, policies: Sequence[Policy]) -> None:
        """The in-process half of a reset: the deny cache's entries and the fallback's state."""
        self.deny_cache.forget(identity)
        self.fallback.reset(identity, policies)

    def _degraded(self, mode: str, checks: Sequence[Check], cost: int, charge: bool,
                  lease: str | None = None) -> list[Decision]:
        """The answer of `mode` when Redis cannot decide (see the class docstring)."""
        if mode == "local":
            decisions = self.fallback.decide(checks, cost, charge=charge, lease=lease)
            allowed = bool(decisions) and decisions[-1].allowed
            with self._stats_lock:
                self._counts["local_allowed" if allowed else "local_denied"] += 1
            if allowed:
                return [dataclasses.replace(d, degraded=True) for d in decisions]
            return decisions
        # bad input is refused the same way with or without Redis
        prepare_call("rl", checks, cost, charge=charge, lease=lease)
        with self._stats_lock:
            self._counts[mode] += 1
        if mode == "open":
            return [OPEN_DECISION] * len(checks)
        # closed: come back when the breaker will try Redis again
        retry_after = self.breaker.retry_in() or self.breaker.base_cooldown
        refused = degraded_decision(False, retry_after)
        return [refused] * len(checks)

    def _reset_watch(self, prefix: str) -> ResetWatch:
        """The reset epoch of this service's key prefix (see ratelimit_app.service.denycache.ResetWatch)."""
        if self._resets is None:
            self._resets = ResetWatch(prefix)
        return self._resets

    def _build_engine(self) -> RateLimiter:
        with self._build_lock:
            if self._engine is None:
                self._engine = self._build()
            return self._engine

    def _breaker_changed(self, state: str, detail: dict[str, Any]) -> None:
        # counted and logged once on "ratelimit_app" (WARNING when opening); the state itself is read
        # from this breaker by whoever shows it (observability.snapshot)
        events.record_breaker_change(previous=detail["previous"], state=state)
        log_event("ratelimit.breaker_detail", logging.DEBUG, state=state, **detail)
        if state == CLOSED:
            # Redis is back: the next outage starts from a clean local state (and frees the memory)
            self.fallback.clear()


def _refused_for_slots(checks: Sequence[Check], decisions: Sequence[Decision]) -> bool:
    """True when a concurrency policy refused (results follow each check's policies, in order)."""
    for (_, policies), decision in zip(checks, decisions, strict=False):
        for policy, result in zip(policies, decision.results, strict=False):
            if policy.algorithm == CONCURRENCY and not result.allowed:
                return True
    return False


def _check_mode(mode: str) -> str:
    if mode not in FAIL_MODES:
        raise ValueError(f"fail_mode: {mode!r} is not one of {', '.join(FAIL_MODES)}")
    return mode


_service = SettingsCached(LimiterService)


def get_limiter() -> LimiterService:
    """The limiter service for this process, configured from settings.RATELIMIT (created on first use,
    rebuilt after every settings change)."""
    return _service.get()
