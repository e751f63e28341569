"""What stands between a decision and Redis: `RedisGuard`, one process' failure handling (time budget, circuit
breaker, fail modes, deny cache, local fallback, lost leases), shared by the sync and the async service.
Each operation's failure policy is written once, as sans-IO steps that yield the Redis calls to make; the
services only drive them (docs/operations.md)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from ..conf.settings import ratelimit_settings
from ..core.decision import Decision, degraded_decision
from ..core.engine import Check, Usage, prepare_call
from ..core.exceptions import BACKEND_ERRORS, BackendError, ScriptsRefused
from ..core.logs import log_event, log_once
from ..core.policies import CONCURRENCY, Policy
from ..core.usage import Reservation
from . import clock, events
from .breaker import CLOSED, PROBE, SKIP, CircuitBreaker
from .breaker import OPEN as BREAKER_OPEN
from .connection import redis_location
from .denycache import DenyCache, ResetWatch
from .fallback import LocalLimiter
from .lostleases import CANCEL, RETRY_INTERVAL, LostLease, LostLeases
from .servicecall import ServiceStats, Steps, T, request_key

OPEN, CLOSED_MODE, LOCAL = "open", "closed", "local"
_FAIL_MODES = (OPEN, CLOSED_MODE, LOCAL)
#: What requests get in each fail mode while Redis does not answer (the log line of an outage says it).
_FAIL_MODE_EFFECTS = {OPEN: "admitted without limits", CLOSED_MODE: "refused with 503",
                     LOCAL: "limited by each process alone"}

#: Redis could not answer: the engine's errors, or the budget's timeout (asyncio.TimeoutError is the built-in
#: TimeoutError from Python 3.11 on, an OSError; before, a class of its own).
_FAILURES: tuple[type[BaseException], ...] = (*BACKEND_ERRORS, asyncio.TimeoutError)

#: The answer of the "open" fail mode: allowed, made without Redis, nothing known about the limits.
OPEN_DECISION = degraded_decision(True)


def check_fail_mode(mode: str) -> str:
    """`mode` when it is a fail mode; ValueError naming the choices otherwise."""
    if mode not in _FAIL_MODES:
        raise ValueError(f"fail_mode: {mode!r} is not one of {', '.join(_FAIL_MODES)}")
    return mode


def without_limits(mode: str) -> Decision:
    """The fail mode's answer when the limiter cannot even tell which limits apply (it raised before it
    could decide): "closed" refuses (HTTP 503); "open" allows, and so does "local", which has no limits
    to count against. Degraded either way."""
    return degraded_decision(mode != CLOSED_MODE)


class RedisGuard:
    """One process' failure handling around Redis. Every argument defaults to its RATELIMIT setting, read once
    here (the services are rebuilt when settings change); invalid ones raise ValueError."""

    def __init__(self, *, fail_mode: str | None = None, budget_ms: float | None = None,
                 app_servers: int | None = None, breaker: CircuitBreaker | None = None,
                 deny_cache_size: int | None = None, fallback: LocalLimiter | None = None) -> None:
        settings = ratelimit_settings
        self.fail_mode = check_fail_mode(settings.FAIL_MODE if fail_mode is None else fail_mode)
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
        self._resets: ResetWatch | None = None  # built on first use (the engine's key prefix)
        self._stats_lock = threading.Lock()
        self._redis_failures = 0
        self._counts = {"open": 0, "closed": 0, "local_allowed": 0, "local_denied": 0}
        #: slots nobody could give back while Redis did not answer
        self.lost_leases = LostLeases(self._settle, self._retry_pause)
        self._settler: Callable[[Steps[bool]], bool] | None = None

    @classmethod
    def shared_or_new(cls, guard: RedisGuard | None, options: dict[str, Any]) -> RedisGuard:
        """`guard` when given (a service sharing another's), else a new guard built from `options`."""
        if guard is None:
            return cls(**options)
        if options:
            raise TypeError(f"guard: give either a RedisGuard to share or the options of a new one "
                            f"({', '.join(sorted(options))}), not both")
        return guard

    def stats(self) -> ServiceStats:
        with self._stats_lock:
            counts = dict(self._counts)
            failures = self._redis_failures
        return ServiceStats(self.breaker.snapshot(), failures, counts["open"], counts["closed"],
                            counts["local_allowed"], counts["local_denied"], self.deny_cache.hits,
                            len(self.deny_cache), len(self.fallback))

    # -- the steps (driven by the services) ---------------------------------------------------------
    def decide(self, engine: Any, checks: Sequence[Check], cost: int, fail_mode: str | None, charge: bool,
               fresh: bool = False, lease: str | None = None, usage: Usage = ()) -> Steps[list[Decision]]:
        """One decision: the deny cache (after a read of the reset epoch when due), the breaker, then Redis
        (`hit_many`, or `peek` when not `charge`); the fail mode answers when Redis cannot. `engine` is the
        service's engine if built yet. `usage` reserves estimates (the memory backend has none: a usage
        limit counts the request's cost there). A decision that may have run without its reply has its
        lease cancelled once Redis answers again."""
        mode = self.fail_mode if fail_mode is None else check_fail_mode(fail_mode)
        key, cache = None, self.deny_cache
        if len(cache) and not fresh:
            key = request_key(checks, cost)
            cached = yield from self._cached(engine, key)
            if cached is not None:
                return cached
        generation, step = cache.generation, self.breaker.before_call()
        if step == SKIP:
            return self.degraded(mode, checks, cost, charge, lease)
        started, shift = time.monotonic(), clock.offset_ms()
        try:
            if charge:
                decisions = yield (lambda engine: engine.hit_many(checks, cost, lease=lease, clock_shift_ms=shift,
                                                                  usage=usage)), started
            else:
                identity, policies = checks[0]
                decisions = [(yield (lambda engine: engine.peek(identity, policies, cost, clock_shift_ms=shift)),
                              started)]
        except _FAILURES as exc:
            events.observe_latency(time.monotonic() - started)
            return self._failed(step, exc, mode, checks, cost, charge, lease)
        except BaseException as exc:  # bad input, or cancelled: may have been sent, then lost like a reply
            self._abandoned(step)
            if charge and not isinstance(exc, Exception):
                self._lost(checks, lease)
            raise
        events.observe_latency(time.monotonic() - started)
        self.breaker.record_success(probe=step == PROBE)
        # a denial goes into the deny cache, unless a concurrency slot refused it (a slot can free at any
        # moment: a response finishes)
        if decisions and not decisions[-1].allowed and not _refused_for_slots(checks, decisions):
            cache.remember(request_key(checks, cost) if key is None else key,
                           tuple(identity for identity, _ in checks), decisions,
                           started + clock.offset_ms() / 1000, generation)
        return decisions

    def _cached(self, engine: Any, key: Hashable) -> Steps[list[Decision] | None]:
        """The deny cache's answer, unless a reset some process announced since this one last read the
        reset epoch (read when due, never while the breaker is open) clears the cache."""
        cache = self.deny_cache
        # (a denial cached until T is over once the clock, shifted by a test's `advance`, passes T)
        cached = cache.get(key, time.monotonic() + clock.offset_ms() / 1000)
        # when Redis cannot answer, the cache keeps answering
        if cached is None or _client(engine) is None or self.breaker.state != CLOSED:
            return cached
        watch = self.reset_watch(engine.prefix)
        if not watch.due(time.monotonic()):
            return cached
        try:
            epoch = yield (lambda engine: engine.client.get(watch.key)), None
        except _FAILURES:
            return cached
        if not watch.changed(epoch):
            return cached
        cache.clear()
        return None

    def _failed(self, step: int, error: BaseException, mode: str, checks: Sequence[Check], cost: int,
                charge: bool, lease: str | None) -> list[Decision]:
        """Redis could not decide (an error, or the budget ran out): counted; the fail mode answers."""
        self._count_failure(step, error)
        if isinstance(error, ScriptsRefused):  # not an outage: the server as configured cannot decide
            log_once("ratelimit.scripts_refused", logging.ERROR, error=str(error), fail_mode=mode)
        if charge and (not isinstance(error, BackendError) or error.maybe_applied):
            self._lost(checks, lease)
        return self.degraded(mode, checks, cost, charge, lease)

    def release(self, held: Sequence[tuple[str, Policy]], lease: str, local: bool) -> Steps[bool]:
        """Give back slots (see LimiterService.release): False when Redis could not be asked; the release
        is then sent again once it answers, unless the lease has run out by then."""
        if local:
            self.fallback.release(held, lease)
            return True
        answered, _ = yield from self._attempt(lambda engine: engine.release(held, lease))
        if not answered and self._settler is not None:
            self.lost_leases.release(held, lease)
        return answered

    def settle(self, reservation: Reservation, used: Mapping[str, int]) -> Steps[bool]:
        """Settle a reservation (see LimiterService.settle): False when Redis could not be asked."""
        if not reservation.held:
            return True
        return (yield from self._attempted(lambda engine: engine.settle(reservation, used)))

    def renew(self, held: Sequence[tuple[str, Policy]], lease: str, lease_ms: int | None,
              local: bool) -> Steps[bool | None]:
        """Renew slots (see LimiterService.renew): whether all were live, None when Redis was not asked."""
        if local:
            self.fallback.renew(held, lease, lease_ms)
            return True
        answered, live = yield from self._attempt(lambda engine: engine.renew(held, lease, lease_ms))
        return live == len(held) if answered else None

    def reset(self, identity: str, policies: Sequence[Policy]) -> Steps[None]:
        """Forget a state (see LimiterService.reset): here, then in Redis, then announced to the other
        processes (after the delete: see ResetWatch); BackendError when Redis cannot within the budget."""
        self.deny_cache.forget(identity)
        self.fallback.reset(identity, policies)
        started = time.monotonic()
        try:
            yield (lambda engine: engine.reset(identity, policies)), started
            yield self._announce_reset, started
        except asyncio.TimeoutError as exc:
            raise BackendError(f"could not reset {identity!r:.80}: the time budget ran out",
                               maybe_applied=True) from exc

    def _announce_reset(self, engine: Any) -> Any:
        client = _client(engine)
        return None if client is None else self.reset_watch(engine.prefix).announce(client)

    def command(self, command: Callable[[Any], T]) -> Steps[T]:
        """`command(client)` on the engine's Redis client (see LimiterService.call_redis): not a decision,
        it neither counts as one nor moves the breaker."""
        if self.breaker.state is not CLOSED:
            raise BackendError("the limiter's circuit breaker is open: Redis is not asked", maybe_applied=False)
        reply: T = yield (lambda engine: command(_client(engine) or _no_redis())), None
        return reply

    def settle_with(self, drive: Callable[[Steps[bool]], bool]) -> None:
        """Send lost leases' cancellations and releases through `drive` (the sync service's: the first
        service that names one)."""
        if self._settler is None:
            self._settler = drive

    def _attempt(self, run: Callable[[Any], Any]) -> Steps[tuple[bool, Any]]:
        """One call to Redis that is not a decision, through the breaker: (True, its reply) when Redis
        answered; (False, None) when the breaker skipped it or it failed (counted). Anything else it
        raises goes on up."""
        step = self.breaker.before_call()
        if step == SKIP:
            return False, None
        try:
            reply = yield run, None
        except _FAILURES as exc:
            self._count_failure(step, exc)
            return False, None
        except BaseException:
            self._abandoned(step)
            raise
        self.breaker.record_success(probe=step == PROBE)
        return True, reply

    def _count_failure(self, step: int, error: BaseException) -> None:
        with self._stats_lock:
            self._redis_failures += 1
        self.breaker.record_failure(error, probe=step == PROBE)

    def _abandoned(self, step: int) -> None:
        """A call made at breaker `step` ended without an answer or a Redis failure (bad input, cancelled)."""
        if step == PROBE:
            self.breaker.abandon_probe()

    def _lost(self, checks: Sequence[Check], lease: str | None) -> None:
        """The reply of a decision was lost after it was sent: Redis may have run it, now or later. Every
        concurrency slot it may have taken is cancelled under its lease once Redis answers again."""
        if lease is None or self._settler is None:
            return
        held = [(identity, policy) for identity, policies in checks for policy in policies
                if policy.algorithm == CONCURRENCY]
        self.lost_leases.cancel(held, lease)

    def degraded(self, mode: str, checks: Sequence[Check], cost: int, charge: bool,
                  lease: str | None = None) -> list[Decision]:
        """The answer of `mode` when Redis cannot decide `checks`: degraded (a degraded denial is a 503 with
        Retry-After), except a "local" denial, a plain rate-limit answer (429)."""
        if mode == LOCAL:
            decisions = self.fallback.decide(checks, cost, charge=charge, lease=lease, clock_shift_ms=clock.offset_ms())
            allowed = bool(decisions) and decisions[-1].allowed
            self._count("local_allowed" if allowed else "local_denied")
            if allowed:
                return [d._replace(degraded=True) for d in decisions]
            return decisions
        # bad input is refused the same way with or without Redis
        prepare_call("rl", checks, cost, charge=charge, lease=lease)
        self._count(mode)
        if mode == OPEN:
            return [OPEN_DECISION] * len(checks)
        # closed: come back when the breaker will try Redis again
        retry_after = self.breaker.retry_in() or self.breaker.base_cooldown
        return [degraded_decision(False, retry_after)] * len(checks)

    def _settle(self, lost: LostLease) -> bool:
        """Send one lost lease's cancellation or release (from the thread of `lost_leases`): True when
        Redis took it."""
        drive = self._settler
        if drive is None:
            return False
        if lost.kind == CANCEL:
            return drive(self._attempted(lambda engine: engine.cancel(lost.held, lost.lease)))
        return drive(self._attempted(lambda engine: engine.release(lost.held, lost.lease)))

    def _attempted(self, run: Callable[[Any], Any]) -> Steps[bool]:
        answered, _ = yield from self._attempt(run)
        return answered

    def _retry_pause(self) -> float:
        """Seconds lost leases wait after a failed attempt: until the breaker lets a call through again."""
        return max(RETRY_INTERVAL, self.breaker.retry_in())

    def reset_watch(self, prefix: str) -> ResetWatch:
        """The reset epoch of this key prefix (see ratelimit_app.service.denycache.ResetWatch)."""
        if self._resets is None:
            self._resets = ResetWatch(prefix)
        return self._resets

    def _count(self, name: str) -> None:
        with self._stats_lock:
            self._counts[name] += 1

    def _breaker_changed(self, state: str, detail: dict[str, Any]) -> None:
        # counted and logged once on "ratelimit_app" (WARNING when opening); the state itself is read
        # from this breaker by whoever shows it (observability.snapshot)
        events.record_breaker_change(previous=detail["previous"], state=state)
        log_event("ratelimit.breaker_detail", logging.DEBUG, state=state, **detail)
        if state == BREAKER_OPEN and detail["previous"] == CLOSED:  # (a failed probe: still down, said once)
            log_event("ratelimit.redis_unavailable", logging.WARNING, redis=redis_location(),
                      error=detail.get("error_class", ""), fail_mode=self.fail_mode,
                      requests=f"{_FAIL_MODE_EFFECTS[self.fail_mode]} until Redis answers")
        elif state == CLOSED:
            log_event("ratelimit.redis_available", logging.INFO, redis=redis_location(),
                      outage_seconds=detail.get("outage_seconds", 0))
        if state == CLOSED:
            # Redis is back: the next outage starts from a clean local state (and frees the memory)
            self.fallback.clear()


def _client(engine: Any) -> Any:
    """The Redis client of an engine (None for the memory backend's, or before one is built)."""
    return getattr(engine, "client", None)


def _no_redis() -> Any:
    raise BackendError("RATELIMIT['BACKEND'] is 'memory': there is no Redis to ask", maybe_applied=False)


def _refused_for_slots(checks: Sequence[Check], decisions: Sequence[Decision]) -> bool:
    """True when a concurrency policy refused (results follow each check's policies, in order)."""
    for (_, policies), decision in zip(checks, decisions, strict=False):
        for policy, result in zip(policies, decision.results, strict=False):
            if policy.algorithm == CONCURRENCY and not result.allowed:
                return True
    return False
