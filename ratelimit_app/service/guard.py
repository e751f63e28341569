"""What stands between a decision and Redis, shared by the sync and the async limiter services.

`RedisGuard` holds one process' failure handling (docs/operations.md tells the whole story):

- the time budget (RATELIMIT['BUDGET_MS']) each Redis call may spend;
- a circuit breaker (ratelimit_app.service.breaker): after BREAKER_FAILURES consecutive failures,
  decisions skip Redis until a single probe finds it answering again;
- the fail modes, for decisions Redis cannot make: "open" (allow, degraded), "closed" (refuse,
  degraded: HTTP 503 with Retry-After) or "local" (the in-process limiter of
  ratelimit_app.service.fallback, each policy divided by APP_SERVERS);
- a local deny cache (ratelimit_app.service.denycache): a request Redis denied until T is denied in
  process until T, without a Redis call; a reset in any process clears it everywhere within
  RESET_CHECK_INTERVAL (the deny cache reads the reset epoch at most that often, see ResetWatch);
- the slots nobody could give back while Redis did not answer (ratelimit_app.service.lostleases): a
  decision whose reply was lost has its lease cancelled, a release that failed is sent again, once
  Redis answers, over the sync engine of the service that `settle_with` names.

A service drives one decision through it: `open` before the Redis call (deny cache, breaker); when
`open` leaves `call.watch` set, the service reads the reset epoch and hands it to `epoch_read`; then,
when no answer is known yet, the service asks Redis and ends with exactly one of `answered`, `failed`
or `abandoned`. Only the I/O is the service's: `LimiterService` (sync) and `AsyncLimiterService`
(asyncio) are twins around one guard per process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..conf.settings import ratelimit_settings
from ..core.budget import within_budget
from ..core.decision import Decision, degraded_decision
from ..core.engine import Check, prepare_call
from ..core.engine_sync import RateLimiter
from ..core.exceptions import BACKEND_ERRORS, BackendError, ScriptsRefused
from ..core.logs import log_event, log_once
from ..core.policies import CONCURRENCY, Policy
from . import clock, events
from .breaker import CLOSED, PROBE, SKIP, CircuitBreaker
from .breaker import OPEN as BREAKER_OPEN
from .connection import redis_location
from .denycache import DenyCache, ResetWatch
from .fallback import LocalLimiter
from .lostleases import CANCEL, RETRY_INTERVAL, LostLease, LostLeases
from .servicecall import ServiceCall, ServiceStats, request_key

OPEN, CLOSED_MODE, LOCAL = "open", "closed", "local"
FAIL_MODES = (OPEN, CLOSED_MODE, LOCAL)
#: What requests get in each fail mode while Redis does not answer (the log line of an outage says it).
FAIL_MODE_EFFECTS = {OPEN: "admitted without limits", CLOSED_MODE: "refused with 503",
                     LOCAL: "limited by each process alone"}

#: The answer of the "open" fail mode: allowed, made without Redis, nothing known about the limits.
OPEN_DECISION = degraded_decision(True)


def check_fail_mode(mode: str) -> str:
    """`mode` when it is a fail mode; ValueError naming the choices otherwise."""
    if mode not in FAIL_MODES:
        raise ValueError(f"fail_mode: {mode!r} is not one of {', '.join(FAIL_MODES)}")
    return mode


def without_limits(mode: str) -> Decision:
    """The fail mode's answer when the limiter cannot even tell which limits apply (it raised before it
    could decide): "closed" refuses (HTTP 503); "open" allows, and so does "local", which has no limits
    to count against. Degraded either way."""
    return degraded_decision(mode != CLOSED_MODE)


class RedisGuard:
    """One process' failure handling around Redis (see the module docstring).

    Every argument defaults to its RATELIMIT setting, read once here (the services are rebuilt when
    settings change). Invalid arguments (an unknown fail mode, a budget <= 0) raise ValueError.
    """

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
        self._settler: Callable[[], RateLimiter] | None = None

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
        """A snapshot of the counters."""
        with self._stats_lock:
            counts = dict(self._counts)
            failures = self._redis_failures
        return ServiceStats(self.breaker.snapshot(), failures, counts["open"], counts["closed"],
                            counts["local_allowed"], counts["local_denied"], self.deny_cache.hits,
                            len(self.deny_cache), len(self.fallback))

    # -- one decision ------------------------------------------------------------------------------
    def open(self, checks: Sequence[Check], cost: int, fail_mode: str | None, charge: bool, fresh: bool,
             prefix: str | None, lease: str | None = None) -> ServiceCall:
        """A call on its way to Redis, or with its `answer` already known (deny cache, breaker open).

        `prefix` is the key prefix of the caller's engine, None when it has none yet (the reset epoch
        is then not read). A cached denial comes with `call.watch` set when the reset epoch is due to
        be read first (see ResetWatch): the answer stands unless `epoch_read` finds it changed.
        """
        mode = self.fail_mode if fail_mode is None else check_fail_mode(fail_mode)
        call = ServiceCall(checks, cost, mode, charge, lease)
        cache = self.deny_cache
        if len(cache) and not fresh:
            call.key = request_key(checks, cost)
            # (a denial cached until T is over once the clock, shifted by a test's `advance`, passes T)
            call.answer = cache.get(call.key, time.monotonic() + clock.offset_ms() / 1000)
            if call.answer is not None:
                # never while the breaker is open; when Redis cannot answer, the cache keeps answering
                if prefix is not None and self.breaker.state == CLOSED:
                    watch = self.reset_watch(prefix)
                    if watch.due(time.monotonic()):
                        call.watch = watch
                return call
        return self._to_redis(call)

    def epoch_read(self, call: ServiceCall, epoch: Any, failed: bool = False) -> ServiceCall:
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
            call.answer = self.degraded(call.mode, call.checks, call.cost, call.charge, call.lease)
        else:
            call.started = time.monotonic()
        return call

    def answered(self, call: ServiceCall, decisions: list[Decision]) -> list[Decision]:
        """Redis decided: count the latency and the success; a denial goes into the deny cache, unless
        a concurrency slot refused it (a slot can free at any moment: a response finishes)."""
        events.observe_latency(time.monotonic() - call.started)
        self.breaker.record_success(probe=call.step == PROBE)
        if decisions and not decisions[-1].allowed and not _refused_for_slots(call.checks, decisions):
            self.deny_cache.remember(request_key(call.checks, call.cost) if call.key is None else call.key,
                                     tuple(identity for identity, _ in call.checks), decisions,
                                     call.started + clock.offset_ms() / 1000, call.generation)
        return decisions

    def failed(self, call: ServiceCall, error: BaseException) -> list[Decision]:
        """Redis could not decide (an error, or the budget ran out): count it; the fail mode answers.
        A decision that may have run takes no slot for good: its lease is cancelled (`_lost`)."""
        events.observe_latency(time.monotonic() - call.started)
        self.count_failure(call.step, error)
        if isinstance(error, ScriptsRefused):  # not an outage: the server as configured cannot decide
            log_once("ratelimit.scripts_refused", logging.ERROR, error=str(error), fail_mode=call.mode)
        if not isinstance(error, BackendError) or error.maybe_applied:
            self._lost(call)
        return self.degraded(call.mode, call.checks, call.cost, call.charge, call.lease)

    def abandoned(self, step: int) -> None:
        """A call made at breaker `step` ended without an answer from Redis or a Redis failure (bad
        input, cancellation)."""
        if step == PROBE:
            self.breaker.abandon_probe()

    def abandoned_call(self, call: ServiceCall, error: BaseException) -> None:
        """`abandoned` for a decision that raised `error`: a cancelled one (CancelledError,
        KeyboardInterrupt) may have been sent, and its lease is cancelled like a lost reply's."""
        self.abandoned(call.step)
        if not isinstance(error, Exception):
            self._lost(call)

    def _lost(self, call: ServiceCall) -> None:
        """The reply of `call` was lost after it was sent: Redis may have run it, now or later. Every
        concurrency slot it may have taken is cancelled under its lease once Redis answers again."""
        if call.lease is None or not call.charge or self._settler is None:
            return
        held = [(identity, policy) for identity, policies in call.checks for policy in policies
                if policy.algorithm == CONCURRENCY]
        self.lost_leases.cancel(held, call.lease)

    def degraded(self, mode: str, checks: Sequence[Check], cost: int, charge: bool,
                 lease: str | None = None) -> list[Decision]:
        """The answer of `mode` when Redis cannot decide `checks`.

        A decision made without Redis has `degraded=True`; a degraded denial means "refused because the
        limiter is unavailable" (HTTP 503 with Retry-After). In "local" mode a request over its local
        share is denied like any rate-limited request (`allowed=False, degraded=False`: HTTP 429).
        """
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

    # -- other calls to Redis ----------------------------------------------------------------------
    def step(self) -> int | None:
        """The breaker's step for a call that is not a decision (a release): None when Redis is skipped."""
        step = self.breaker.before_call()
        return None if step == SKIP else step

    def succeeded(self, step: int) -> None:
        """A call made at breaker `step` got its answer from Redis."""
        self.breaker.record_success(probe=step == PROBE)

    def count_failure(self, step: int, error: BaseException) -> None:
        """A call made at breaker `step` failed or timed out."""
        with self._stats_lock:
            self._redis_failures += 1
        self.breaker.record_failure(error, probe=step == PROBE)

    def release_failed(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Redis could not be asked to release these slots (the breaker skipped it, or it failed): the
        release is sent again once Redis answers, unless the lease has run out by then."""
        if self._settler is not None:
            self.lost_leases.release(held, lease)

    def settle_with(self, engine: Callable[[], RateLimiter]) -> None:
        """Send lost leases' cancellations and releases over `engine()` (the sync service's engine: the
        first service that names one)."""
        if self._settler is None:
            self._settler = engine

    def attempt(self, call: Callable[[], object]) -> bool:
        """Make one call to Redis that is not a decision (a release, a lost lease's settlement) through the
        breaker and within the budget: True when Redis answered, False when the breaker skipped it or it
        failed (counted). Anything else `call` raises goes on up."""
        step = self.step()
        if step is None:
            return False
        try:
            with within_budget(self.budget):
                call()
        except BACKEND_ERRORS as exc:
            self.count_failure(step, exc)
            return False
        except BaseException:
            self.abandoned(step)
            raise
        self.succeeded(step)
        return True

    def _settle(self, lost: LostLease) -> bool:
        """Send one lost lease's cancellation or release (from the thread of `lost_leases`): True when
        Redis took it."""
        settler = self._settler
        if settler is None:
            return False
        if lost.kind == CANCEL:
            return self.attempt(lambda: settler().cancel(lost.held, lost.lease))
        return self.attempt(lambda: settler().release(lost.held, lost.lease))

    def _retry_pause(self) -> float:
        """Seconds lost leases wait after a failed attempt: until the breaker lets a call through again."""
        return max(RETRY_INTERVAL, self.breaker.retry_in())

    def forget_locally(self, identity: str, policies: Sequence[Policy]) -> None:
        """The in-process half of a reset: the deny cache's entries and the fallback's state."""
        self.deny_cache.forget(identity)
        self.fallback.reset(identity, policies)

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
                      requests=f"{FAIL_MODE_EFFECTS[self.fail_mode]} until Redis answers")
        elif state == CLOSED:
            log_event("ratelimit.redis_available", logging.INFO, redis=redis_location(),
                      outage_seconds=detail.get("outage_seconds", 0))
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
