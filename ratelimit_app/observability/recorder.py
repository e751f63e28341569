"""Decision metrics counted in process (cheap: no Redis on the request path) and flushed to Redis in numbered
batches by a daemon thread, once each however often they are sent; the limiter service's latency and breaker
reports. docs/observability.md, "Decision metrics in Redis", says how and how exactly."""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import threading
import time
import uuid
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from ..conf.settings import InvalidSetting, on_reload, ratelimit_settings
from ..core.logs import log_breaker_change, log_denial, log_event, logger
from ..service.breaker import CLOSED, HALF_OPEN, OPEN
from .pending import PendingCounts, SealedBatch, add_identity, apply_batch
from .schema import HOUR, top_candidates

#: Label of decisions that name no policy (allowed requests).
_NO_POLICY = "none"
#: States of the circuit breaker in front of Redis (`record_breaker_change`, the Prometheus gauge).
BREAKER_STATES: tuple[str, ...] = (CLOSED, OPEN, HALF_OPEN)
#: Upper bounds (seconds) of the limiter latency histogram buckets; a last +Inf bucket follows.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)
#: Distinct tier and policy labels counted per process; further ones are counted as "other".
_MAX_LABELS = 200

_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class _Target:
    prefix: str
    enabled: bool


class _ProcessRecorder:
    """The process-wide counters (one instance, `process_recorder`; observability.snapshot reads them under
    `lock`)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start from zero: when created, and in a forked child (the parent flushes what it counted)."""
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.flush_lock = threading.Lock()
        self.thread_lock = threading.Lock()
        self.target: _Target | None = None
        self.labels: dict[str, str] = {}
        self.batches: dict[str, PendingCounts] = {}  # open: counts are added here
        self.sealed: list[SealedBatch] = []  # sent or about to be: never changed, sent until applied
        self.writer = uuid.uuid4().hex  # a forked child is a writer of its own
        self.number = 0  # of the last sealed batch
        self.totals: dict[tuple[str, str, str, bool], int] = {}
        self.shadow_totals: dict[tuple[str, str], int] = {}
        self.usage_totals: dict[tuple[str, str, str], int] = {}
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self.transitions: dict[str, int] = {}
        self.flushes = 0
        self.flush_errors = 0
        self.dropped = 0
        self.last_flush: float | None = None
        self.failing = False
        self.thread: threading.Thread | None = None
        self.stop_event = threading.Event()
        self.wake_event = threading.Event()

    def check_fork(self) -> None:
        """Reset in a forked child that has not been reset yet (no os.register_at_fork, or a fork
        that bypassed it)."""
        if self.pid != os.getpid():
            self.reset()

    # -- request path --------------------------------------------------------------------------
    def record(self, outcome: str, tier: str, policy: str | None, degraded: bool, identity: str) -> None:
        """Count one decision: outcome "allowed", "blocked", "unauthorized", "allowed_by_list" or "denied_by_list"."""
        target = self._counting_target()
        if target is None:
            return
        hour = int(time.time()) // HOUR
        tier_label = self._label(tier)
        policy_label = self._label(policy) if policy else _NO_POLICY
        blocked = outcome == "blocked"
        degraded = bool(degraded)
        count_key = (hour, tier_label, policy_label, outcome, degraded)
        total_key = (tier_label, policy_label, outcome, degraded)
        with self.lock:
            batch = self._batch(target.prefix)
            batch.counts[count_key] = batch.counts.get(count_key, 0) + 1
            self.totals[total_key] = self.totals.get(total_key, 0) + 1
            if blocked and not add_identity(batch.blocked, (hour // 24, identity)):
                self.dropped += 1
        if self.thread is None:
            self.start()
        if blocked and logger.isEnabledFor(logging.DEBUG):
            log_denial(tier=tier_label, policy=policy_label, identity=identity, degraded=degraded)

    def record_shadow(self, tier: str, policies: tuple[str, ...], identity: str) -> None:
        target = self._counting_target()
        if target is None:
            return
        hour = int(time.time()) // HOUR
        tier_label = self._label(tier)
        with self.lock:
            batch = self._batch(target.prefix)
            for policy in policies:
                policy_label = self._label(policy)
                key = (hour, tier_label, policy_label)
                batch.shadow[key] = batch.shadow.get(key, 0) + 1
                total_key = (tier_label, policy_label)
                self.shadow_totals[total_key] = self.shadow_totals.get(total_key, 0) + 1
            add_identity(batch.shadow_identities, (hour // 24, identity))
        if self.thread is None:
            self.start()

    def record_usage(self, tier: str, used: tuple[tuple[str, str, int], ...]) -> None:
        """Count the units one request used under the usage limits of `tier`: (policy, unit, count) each."""
        target = self._counting_target()
        if target is None or not used:
            return
        hour = int(time.time()) // HOUR
        tier_label = self._label(tier)
        with self.lock:
            batch = self._batch(target.prefix)
            for policy, unit, count in used:
                total_key = (tier_label, self._label(policy), self._label(unit))
                hour_key = (hour, *total_key)
                batch.usage[hour_key] = batch.usage.get(hour_key, 0) + count
                self.usage_totals[total_key] = self.usage_totals.get(total_key, 0) + count
        if self.thread is None:
            self.start()

    def _counting_target(self) -> _Target | None:
        """Where this process counts now, or None when metrics are off (RATELIMIT['METRICS_ENABLED'])."""
        self.check_fork()
        target = self.target or self._load_target()
        return target if target.enabled else None

    def _batch(self, prefix: str) -> PendingCounts:
        """The unflushed counts of `prefix` (call with `lock` held)."""
        batch = self.batches.get(prefix)
        if batch is None:
            batch = self.batches[prefix] = PendingCounts(prefix)
        return batch

    def _label(self, value: Any) -> str:
        label = self.labels.get(value)
        if label is None:
            label = _LABEL_CHARS.sub("_", str(value))[:64] or "_"
            if len(self.labels) >= _MAX_LABELS:
                return "other"
            self.labels[value] = label
        return label

    def _load_target(self) -> _Target:
        try:
            target = _Target(ratelimit_settings.KEY_PREFIX, bool(ratelimit_settings.METRICS_ENABLED))
        except InvalidSetting:  # nothing is counted until it is fixed (the settings' log line says which)
            target = _Target("", False)
        self.target = target
        return target

    def forget_settings(self) -> None:
        """Settings changed: read the prefix and switch again on the next decision (unflushed counts keep
        theirs); the flusher wakes up to flush them and wait the new interval."""
        self.target = None
        self.wake_event.set()

    # -- flushing ------------------------------------------------------------------------------
    def start(self) -> None:
        with self.thread_lock:
            if self.thread is not None and self.thread.is_alive():
                return
            self.stop_event = threading.Event()
            self.wake_event = threading.Event()
            thread = threading.Thread(target=self._run, name="ratelimit-metrics-flusher", daemon=True)
            try:
                thread.start()
            except RuntimeError:
                return  # interpreter shutdown: the atexit flush sends what is counted
            self.thread = thread

    def _run(self) -> None:
        stop, wake = self.stop_event, self.wake_event
        while not stop.is_set():
            wake.wait(_setting("METRICS_FLUSH_INTERVAL", 1.0))
            wake.clear()
            if stop.is_set():
                break
            try:
                self.flush()
            except Exception:  # the flusher must outlive any bug; the counts were kept by flush()
                logger.exception("ratelimit.metrics_flusher_error")

    def flush(self) -> bool:
        self.check_fork()
        with self.flush_lock:
            outstanding = bool(self.sealed)  # sent before and not known applied: it goes first, unchanged
            if not outstanding:
                self._seal()
            if not self.sealed:
                return True
            if not self._send():
                return False
            if outstanding:  # what was counted before this call is still open: send it too
                self._seal()
                if not self._send():
                    return False
            self.flushes += 1
            self.last_flush = time.time()
            if self.failing:
                self.failing = False
                log_event("ratelimit.metrics_flush_recovered", logging.INFO)
            return True

    def _seal(self) -> None:
        """Turn the open counts into numbered batches (call with `flush_lock` held), without the hours
        Redis would have expired already."""
        oldest_hour = int(time.time()) // HOUR - _ttl_hours()
        with self.lock:
            batches, self.batches = self.batches, {}
            for counts in batches.values():
                self.dropped += counts.prune(oldest_hour)
                if not counts.empty():
                    self.number += 1
                    self.sealed.append(SealedBatch(counts, self.writer, self.number, time.time()))

    def _send(self) -> bool:
        """Apply the sealed batches in order (call with `flush_lock` held); False when Redis did not answer:
        the batch that failed and those after it stay sealed, to be sent again as they are."""
        while self.sealed:
            batch = self.sealed[0]
            if time.time() - batch.sealed_at > _ttl_hours() * HOUR:  # the applied marker may expire: give up
                with self.lock:
                    self.dropped += batch.counts.size()
            else:
                try:
                    self._write(batch)
                except Exception as exc:  # Redis down, slow or misconfigured: keep the batch, retry later
                    self.flush_errors += 1
                    if not self.failing:
                        self.failing = True
                        log_event("ratelimit.metrics_flush_failed", logging.WARNING,
                                  error=f"{type(exc).__name__}: {exc}", pending=self.pending())
                    return False
            self.sealed.pop(0)
        return True

    def pending(self) -> int:
        """Decisions counted and not yet known to be in Redis (open and sealed)."""
        return sum(batch.size() for batch in list(self.batches.values())) + \
            sum(batch.counts.size() for batch in list(self.sealed))

    @staticmethod
    def _write(batch: SealedBatch) -> None:
        if ratelimit_settings.BACKEND == "memory":
            return  # no Redis: the counts stay in this process' totals (GET /metrics), not in the dashboard
        from ..service.connection import get_redis

        apply_batch(get_redis(), batch, ttl=_ttl_hours() * HOUR,
                    keep=top_candidates(int(ratelimit_settings.TOP_BLOCKED)))

    def shutdown(self) -> None:
        """Stop the flusher and flush what is left (atexit)."""
        self.check_fork()
        self.stop_event.set()
        self.wake_event.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self.thread = None
        self.flush()

    # -- resilience reports ----------------------------------------------------------------------
    def observe_latency(self, seconds: float) -> None:
        index = bisect_left(LATENCY_BUCKETS, seconds)
        with self.lock:
            self.latency_counts[index] += 1
            self.latency_sum += seconds

    def count_transition(self, state: str) -> None:
        with self.lock:
            self.transitions[state] = self.transitions.get(state, 0) + 1


def _setting(name: str, default: Any) -> Any:
    """A setting the flusher needs whatever RATELIMIT holds: `default` while it cannot be read."""
    try:
        return type(default)(getattr(ratelimit_settings, name))
    except Exception:
        return default


def _ttl_hours() -> int:
    return int(_setting("METRICS_TTL_HOURS", 48))


process_recorder = _ProcessRecorder()
on_reload(process_recorder.forget_settings)
atexit.register(process_recorder.shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=process_recorder.reset)


def record_decision(*, allowed: bool, tier: str, policy: str | None, degraded: bool, identity: str,
                    unauthorized: bool = False, listed: str = "") -> None:
    """Count one limited request in process (denials are also logged at DEBUG; nothing when METRICS_ENABLED
    is False). `tier` is the tier slug ("ip": the per-IP limit alone), `policy` the one that denied (None when
    allowed), `degraded` whether Redis was bypassed, `identity` a display label ("key:<prefix>", never a full
    key), `unauthorized` a 401, `listed` "allow" or "deny" when an allow or deny rule decided."""
    if unauthorized:
        outcome = "unauthorized"
    elif listed:
        outcome = "denied_by_list" if listed == "deny" else "allowed_by_list"
    else:
        outcome = "allowed" if allowed else "blocked"
    process_recorder.record(outcome, tier, policy, degraded, identity)


def record_shadow_blocked(*, tier: str, policies: tuple[str, ...], identity: str) -> None:
    """Count one allowed request that the shadow (dry-run) `policies` would have refused, per tier and policy
    and per identity (in process, like `record_decision`)."""
    process_recorder.record_shadow(tier, tuple(policies), identity)


def record_usage(*, tier: str, used: tuple[tuple[str, str, int], ...]) -> None:
    """Count the units one request used, settled when it ended, under the usage limits of `tier`: one
    (policy, unit, count) per limit (in process, like `record_decision`)."""
    process_recorder.record_usage(tier, tuple(used))


def observe_latency(seconds: float) -> None:
    """Record the duration of one limiter call to Redis, in seconds (negative and NaN values are ignored)."""
    if not isinstance(seconds, (int, float)) or math.isnan(seconds) or seconds < 0:
        return
    process_recorder.observe_latency(float(seconds))


def record_breaker_change(*, previous: str, state: str) -> None:
    """Count and log ("ratelimit.breaker") one change of the circuit breaker in front of Redis, from `previous`
    into `state`; ValueError for a state not in BREAKER_STATES."""
    if state not in BREAKER_STATES:
        raise ValueError(f"state: {state!r} is not a breaker state; expected one of {', '.join(BREAKER_STATES)}")
    process_recorder.count_transition(state)
    log_breaker_change(previous=previous, state=state)


def flush() -> bool:
    """Send every count recorded before the call to Redis now (waiting for a flush in progress); True when Redis
    holds them all on return, False when it could not be written (the counts are kept for the next flush)."""
    return process_recorder.flush()
