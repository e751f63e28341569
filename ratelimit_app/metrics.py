"""Decision metrics: counted in process, flushed to Redis in batches, queried by the dashboard.

The request path calls `record_decision` once per limited request: one or two dict increments
under a lock, no Redis round trip, no database write. A daemon thread ("ratelimit-metrics-flusher")
sends the counts to Redis in one pipeline (MULTI/EXEC on a single Redis) every
RATELIMIT['METRICS_FLUSH_INTERVAL'] seconds (default 1), and once more at interpreter exit (atexit).
A forked worker (gunicorn, multiprocessing) starts with empty counters of its own and its own
flusher, so counts the parent had not flushed yet are flushed once, by the parent.

What Redis holds (`<KEY_PREFIX>` is RATELIMIT['KEY_PREFIX']; every key lives METRICS_TTL_HOURS
hours after its last write, default 48):
- `<KEY_PREFIX>:{metrics}:h:<YYYYMMDDHH>` (UTC hour), a hash of counters: `allowed`, `blocked`,
  `unauthorized` (401s), `degraded`, `degraded_blocked`, `tier:<tier>:allowed`, `tier:<tier>:blocked`,
  `tier:<tier>:unauthorized`, `policy:<policy>:blocked`; for allow/deny lists `denied_by_list`,
  `allowed_by_list` and `tier:<tier>:<either>`; for shadow limits `shadow:<tier>:<policy>` (requests a
  shadow limit would have refused).
- `<KEY_PREFIX>:{metrics}:blocked:<YYYYMMDD>` (UTC day), a sorted set of blocked identity labels
  ("key:<prefix>" or "ip:<address>", never a full key) scored by blocked requests. It keeps the
  `max(50 x TOP_BLOCKED, 1000)` most blocked identities of the day; queries return TOP_BLOCKED.
- `<KEY_PREFIX>:{metrics}:shadow:<YYYYMMDD>` (UTC day), the same for identities a shadow limit would
  have blocked.

Accuracy: stored counts equal recorded counts once `flush()` has returned True (the flusher does
that within one interval; a reader may miss at most the last interval). If Redis is down, counts stay
in memory and are retried every interval: hours older than the TTL are dropped and at most 10,000
distinct blocked identities are kept per batch (`ProcessMetrics.dropped` counts what was lost). If
the connection breaks while Redis executes a batch, that one batch may be counted twice.
Hours are bucketed by this server's clock (UTC); counting needs no shared clock.

Other parts report to this module: `observe_latency(seconds)` (time of one limiter call to Redis)
and `set_breaker_state(state)` (the circuit breaker in front of Redis). Degraded decisions are
counted by `record_decision(degraded=True)`, once per request; do not report them twice.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any

from .conf import on_reload, ratelimit_settings
from .logs import log_breaker_change, log_config_error, log_denial, log_event, logger, safe_identity

HOUR = 3600
#: Label of decisions that name no policy (allowed requests).
NO_POLICY = "none"
#: What a limited request came to: allowed, blocked (429 or a fail-mode 503) or unauthorized (401: no
#: usable API key; charged to the per-IP limit only).
#: allowed_by_list / denied_by_list: an allow or deny rule (ClientRule) decided, without Redis.
OUTCOMES: tuple[str, ...] = ("allowed", "blocked", "unauthorized", "allowed_by_list", "denied_by_list")
#: States accepted by `set_breaker_state`.
BREAKER_STATES: tuple[str, ...] = ("closed", "open", "half_open")
#: Upper bounds (seconds) of the limiter latency histogram buckets; a last +Inf bucket follows.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)
#: Distinct blocked identities kept per unflushed batch (memory bound while Redis is down).
MAX_PENDING_IDENTITIES = 10_000
#: Distinct tier and policy labels counted per process; further ones are counted as "other".
MAX_LABELS = 200
#: The widest range `get_metrics_range` reads at once.
MAX_RANGE_HOURS = 24 * 31

_LABEL_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


def top_candidates(top_blocked: int) -> int:
    """How many identities a day's top-blocked set keeps so that its top `top_blocked` are exact."""
    return max(50 * top_blocked, 1000)


def hour_key(prefix: str, hour: int) -> str:
    """Redis key of the counters of `hour` (hours since the epoch, UTC)."""
    return f"{prefix}:{{metrics}}:h:{time.strftime('%Y%m%d%H', time.gmtime(hour * HOUR))}"


def day_key(prefix: str, day: int) -> str:
    """Redis key of the top-blocked set of `day` (days since the epoch, UTC)."""
    return f"{prefix}:{{metrics}}:blocked:{time.strftime('%Y%m%d', time.gmtime(day * 86400))}"


def shadow_day_key(prefix: str, day: int) -> str:
    """Redis key of the identities shadow limits would have blocked on `day` (days since the epoch, UTC)."""
    return f"{prefix}:{{metrics}}:shadow:{time.strftime('%Y%m%d', time.gmtime(day * 86400))}"


# -- in-process counting -----------------------------------------------------------------------

# (hour, tier, policy, outcome, degraded) -> decisions; outcome is one of OUTCOMES
_CountKey = tuple[int, str, str, str, bool]
# (day, identity label as given) -> blocked decisions
_BlockedKey = tuple[int, str]
# (hour, tier, policy) -> requests a shadow limit would have refused
_ShadowKey = tuple[int, str, str]


class _Batch:
    """Counts not yet in Redis, for one key prefix."""

    __slots__ = ("blocked", "counts", "prefix", "shadow", "shadow_identities")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.counts: dict[_CountKey, int] = {}
        self.blocked: dict[_BlockedKey, int] = {}
        self.shadow: dict[_ShadowKey, int] = {}
        self.shadow_identities: dict[_BlockedKey, int] = {}

    def size(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class _Target:
    prefix: str
    enabled: bool


def _add_daily_top(pipe: Any, counts: dict[_BlockedKey, int], key_of: Callable[[str, int], str], prefix: str,
                   keep: int, ttl: int) -> None:
    """Add per-day identity counts to each day's top set (identity labels made safe), keeping its `keep`
    highest and its TTL: the top blocked and the top would-be-blocked identities alike."""
    days: dict[int, dict[str, int]] = {}
    for (day, identity), count in counts.items():
        members = days.setdefault(day, {})
        label = safe_identity(identity)
        members[label] = members.get(label, 0) + count
    for day, members in days.items():
        key = key_of(prefix, day)
        for label, count in members.items():
            pipe.zincrby(key, count, label)
        pipe.zremrangebyrank(key, 0, -(keep + 1))
        pipe.expire(key, ttl)


class _Recorder:
    """The process-wide counters; one instance, `_recorder`. See the module docstring."""

    def __init__(self) -> None:
        self._init_process_state()
        self.breaker_state = "closed"

    def _init_process_state(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.flush_lock = threading.Lock()
        self.thread_lock = threading.Lock()
        self.target: _Target | None = None
        self.labels: dict[str, str] = {}
        self.batches: dict[str, _Batch] = {}
        self.totals: dict[tuple[str, str, str, bool], int] = {}
        self.shadow_totals: dict[tuple[str, str], int] = {}
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

    # -- request path --------------------------------------------------------------------------
    def record(self, outcome: str, tier: str, policy: str | None, degraded: bool, identity: str) -> None:
        if self.pid != os.getpid():
            self.after_fork()
        target = self.target or self._load_target()
        if not target.enabled:
            return
        hour = int(time.time()) // HOUR
        tier_label = self._label(tier)
        policy_label = self._label(policy) if policy else NO_POLICY
        blocked = outcome == "blocked"
        degraded = bool(degraded)
        count_key = (hour, tier_label, policy_label, outcome, degraded)
        total_key = (tier_label, policy_label, outcome, degraded)
        with self.lock:
            batch = self.batches.get(target.prefix)
            if batch is None:
                batch = self.batches[target.prefix] = _Batch(target.prefix)
            batch.counts[count_key] = batch.counts.get(count_key, 0) + 1
            self.totals[total_key] = self.totals.get(total_key, 0) + 1
            if blocked:
                blocked_key = (hour // 24, identity)
                seen = batch.blocked.get(blocked_key)
                if seen is not None:
                    batch.blocked[blocked_key] = seen + 1
                elif len(batch.blocked) < MAX_PENDING_IDENTITIES:
                    batch.blocked[blocked_key] = 1
                else:
                    self.dropped += 1
        if self.thread is None:
            self.start()
        if blocked and logger.isEnabledFor(logging.DEBUG):
            log_denial(tier=tier_label, policy=policy_label, identity=identity, degraded=degraded)

    def record_shadow(self, tier: str, policies: tuple[str, ...], identity: str) -> None:
        if self.pid != os.getpid():
            self.after_fork()
        target = self.target or self._load_target()
        if not target.enabled:
            return
        hour = int(time.time()) // HOUR
        tier_label = self._label(tier)
        with self.lock:
            batch = self.batches.get(target.prefix)
            if batch is None:
                batch = self.batches[target.prefix] = _Batch(target.prefix)
            for policy in policies:
                policy_label = self._label(policy)
                key = (hour, tier_label, policy_label)
                batch.shadow[key] = batch.shadow.get(key, 0) + 1
                total_key = (tier_label, policy_label)
                self.shadow_totals[total_key] = self.shadow_totals.get(total_key, 0) + 1
            identity_key = (hour // 24, identity)
            seen = batch.shadow_identities.get(identity_key)
            if seen is not None:
                batch.shadow_identities[identity_key] = seen + 1
            elif len(batch.shadow_identities) < MAX_PENDING_IDENTITIES:
                batch.shadow_identities[identity_key] = 1
        if self.thread is None:
            self.start()

    def _label(self, value: Any) -> str:
        label = self.labels.get(value)
        if label is None:
            label = _LABEL_CHARS.sub("_", str(value))[:64] or "_"
            if len(self.labels) >= MAX_LABELS:
                return "other"
            self.labels[value] = label
        return label

    def _load_target(self) -> _Target:
        try:
            target = _Target(ratelimit_settings.KEY_PREFIX, bool(ratelimit_settings.METRICS_ENABLED))
        except Exception as exc:  # an invalid RATELIMIT must not break requests; it is logged instead
            log_config_error(exc, where="metrics")
            target = _Target("", False)
        self.target = target
        return target

    def forget_settings(self) -> None:
        """Settings changed: read the prefix and switch again on the next decision.

        Unflushed counts keep the prefix they were recorded under. The flusher wakes up to flush them
        and to wait the (possibly new) interval from now on. A settings change also rebuilds the limiter
        service, whose new circuit breaker starts closed: the reported state follows (not a transition).
        """
        self.target = None
        self.breaker_state = "closed"
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
            wake.wait(self._interval())
            wake.clear()
            if stop.is_set():
                break
            try:
                self.flush()
            except Exception:  # the flusher must outlive any bug; the counts were kept by flush()
                logger.exception("ratelimit.metrics_flusher_error")

    @staticmethod
    def _interval() -> float:
        try:
            return float(ratelimit_settings.METRICS_FLUSH_INTERVAL)
        except Exception:
            return 1.0

    def flush(self) -> bool:
        if self.pid != os.getpid():
            self.after_fork()
        with self.flush_lock:
            with self.lock:
                batches, self.batches = self.batches, {}
            if not batches:
                return True
            try:
                self._write(batches)
            except Exception as exc:  # Redis down, slow or misconfigured: keep the counts, retry later
                self._restore(batches)
                self.flush_errors += 1
                if not self.failing:
                    self.failing = True
                    log_event("ratelimit.metrics_flush_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}",
                              pending=sum(batch.size() for batch in batches.values()))
                return False
            self.flushes += 1
            self.last_flush = time.time()
            if self.failing:
                self.failing = False
                log_event("ratelimit.metrics_flush_recovered", logging.INFO)
            return True

    @staticmethod
    def _write(batches: dict[str, _Batch]) -> None:
        from redis.cluster import RedisCluster

        from .connection import get_redis

        client = get_redis()
        ttl = int(ratelimit_settings.METRICS_TTL_HOURS) * HOUR
        keep = top_candidates(int(ratelimit_settings.TOP_BLOCKED))
        # One MULTI/EXEC on a single Redis: a batch lands whole or not at all. Every metrics key shares
        # the {metrics} hash tag, yet cluster pipelines are sent without a transaction.
        pipe = client.pipeline(transaction=not isinstance(client, RedisCluster))
        for batch in batches.values():
            hours: dict[int, dict[str, int]] = {}
            for (hour, tier, policy, outcome, degraded), count in batch.counts.items():
                fields = hours.setdefault(hour, {})
                for name in _fields(tier, policy, outcome, degraded):
                    fields[name] = fields.get(name, 0) + count
            for (hour, tier, policy), count in batch.shadow.items():
                fields = hours.setdefault(hour, {})
                name = f"shadow:{tier}:{policy}"
                fields[name] = fields.get(name, 0) + count
            for hour, fields in hours.items():
                key = hour_key(batch.prefix, hour)
                for name, count in fields.items():
                    pipe.hincrby(key, name, count)
                pipe.expire(key, ttl)
            _add_daily_top(pipe, batch.blocked, day_key, batch.prefix, keep, ttl)
            _add_daily_top(pipe, batch.shadow_identities, shadow_day_key, batch.prefix, keep, ttl)
        pipe.execute()

    def _restore(self, batches: dict[str, _Batch]) -> None:
        try:
            ttl_hours = int(ratelimit_settings.METRICS_TTL_HOURS)
        except Exception:
            ttl_hours = 48
        oldest_hour = int(time.time()) // HOUR - ttl_hours
        with self.lock:
            for prefix, old in batches.items():
                batch = self.batches.get(prefix)
                if batch is None:
                    batch = self.batches[prefix] = _Batch(prefix)
                for count_key, count in old.counts.items():
                    if count_key[0] < oldest_hour:
                        self.dropped += count  # would have expired in Redis already
                        continue
                    batch.counts[count_key] = batch.counts.get(count_key, 0) + count
                for blocked_key, count in old.blocked.items():
                    if blocked_key in batch.blocked or len(batch.blocked) < MAX_PENDING_IDENTITIES:
                        batch.blocked[blocked_key] = batch.blocked.get(blocked_key, 0) + count
                    else:
                        self.dropped += count
                for shadow_key, count in old.shadow.items():
                    if shadow_key[0] >= oldest_hour:
                        batch.shadow[shadow_key] = batch.shadow.get(shadow_key, 0) + count
                for identity_key, count in old.shadow_identities.items():
                    if identity_key in batch.shadow_identities or len(batch.shadow_identities) < MAX_PENDING_IDENTITIES:
                        batch.shadow_identities[identity_key] = batch.shadow_identities.get(identity_key, 0) + count

    def shutdown(self) -> None:
        """Stop the flusher and flush what is left (atexit)."""
        if self.pid != os.getpid():
            self.after_fork()
        self.stop_event.set()
        self.wake_event.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self.thread = None
        self.flush()

    def after_fork(self) -> None:
        """In a forked child: the parent flushes what it counted; the child starts from zero."""
        breaker_state = self.breaker_state
        self._init_process_state()
        self.breaker_state = breaker_state

    # -- resilience reports ----------------------------------------------------------------------
    def observe_latency(self, seconds: float) -> None:
        index = bisect_left(LATENCY_BUCKETS, seconds)
        with self.lock:
            self.latency_counts[index] += 1
            self.latency_sum += seconds

    def set_breaker_state(self, state: str) -> None:
        with self.lock:
            previous = self.breaker_state
            if previous == state:
                return
            self.breaker_state = state
            self.transitions[state] = self.transitions.get(state, 0) + 1
        log_breaker_change(previous=previous, state=state)


def _fields(tier: str, policy: str, outcome: str, degraded: bool) -> list[str]:
    fields = [outcome, f"tier:{tier}:{outcome}"]
    if outcome == "blocked":
        fields.append(f"policy:{policy}:blocked")
    if degraded:
        fields.append("degraded")
        if outcome == "blocked":
            fields.append("degraded_blocked")
    return fields


_recorder = _Recorder()
on_reload(_recorder.forget_settings)
atexit.register(_recorder.shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_recorder.after_fork)


def record_decision(*, allowed: bool, tier: str, policy: str | None, degraded: bool, identity: str,
                    unauthorized: bool = False, listed: str = "") -> None:
    """Count one limited request (cheap: in-process counters only; see the module docstring).

    `tier` is the tier slug ("free", or "ip" for the per-IP limit alone); `policy` the name of the policy
    that denied (None when allowed); `degraded` whether Redis was bypassed; `identity` a display label
    such as "key:<prefix>" or "ip:203.0.113.7" -- never a full API key (a "key:" label is cut at its
    first "." before it is stored, as a safeguard). `unauthorized` marks a 401 (no usable API key):
    counted as its own outcome, neither allowed nor blocked. `listed` ("allow" or "deny") marks a
    request an allow or deny rule decided: outcome "allowed_by_list" or "denied_by_list". Denials are
    also logged at DEBUG. Does nothing when RATELIMIT['METRICS_ENABLED'] is False.
    """
    if unauthorized:
        outcome = "unauthorized"
    elif listed:
        outcome = "denied_by_list" if listed == "deny" else "allowed_by_list"
    else:
        outcome = "allowed" if allowed else "blocked"
    _recorder.record(outcome, tier, policy, degraded, identity)


def record_shadow_blocked(*, tier: str, policies: tuple[str, ...], identity: str) -> None:
    """Count one request that the shadow (dry-run) `policies` would have refused, but which was allowed.

    Counted per tier and policy (Prometheus `ratelimit_shadow_blocked_total`, the hourly hash) and per
    identity (the day's top would-be-blocked identities). In-process only, like `record_decision`.
    """
    _recorder.record_shadow(tier, tuple(policies), identity)


def observe_latency(seconds: float) -> None:
    """Record the duration of one limiter call to Redis, in seconds (the Prometheus latency histogram).

    Called by the limiter service around each Redis call (successful or not). Negative and NaN
    values are ignored. Cheap: one bisect and an increment under a lock; process-local.
    """
    if not isinstance(seconds, (int, float)) or math.isnan(seconds) or seconds < 0:
        return
    _recorder.observe_latency(float(seconds))


def set_breaker_state(state: str) -> None:
    """Report the state of the circuit breaker in front of Redis: "closed", "open" or "half_open".

    Called by the limiter service whenever its breaker changes state (calling it with the current state
    is a no-op, so it may also be called on every check). A change is counted (Prometheus
    `ratelimit_breaker_transitions_total`) and logged on "ratelimit_app": WARNING when it opens, INFO
    otherwise -- callers need not log it themselves. Raises ValueError for any other state.
    """
    if state not in BREAKER_STATES:
        raise ValueError(f"state: {state!r} is not a breaker state; expected one of {', '.join(BREAKER_STATES)}")
    _recorder.set_breaker_state(state)


def breaker_state() -> str:
    """The breaker state last reported in this process ("closed" until one is reported)."""
    return _recorder.breaker_state


def flush() -> bool:
    """Send every count recorded so far to Redis now; True when Redis holds them all on return.

    False when Redis could not be written: the counts are kept and retried by the next flush. Waits for
    a flush in progress on another thread, so a True answer covers everything recorded before the call.
    """
    return _recorder.flush()


# -- process snapshot (Prometheus) ---------------------------------------------------------------

@dataclass(frozen=True)
class DecisionCount:
    """Decisions counted by this process since it started, for one combination of labels."""

    tier: str
    policy: str
    outcome: str  # one of OUTCOMES
    degraded: bool
    count: int


@dataclass(frozen=True)
class ShadowCount:
    """Requests a shadow limit (`policy`, of `tier`) would have refused: counted by this process, or
    stored for an hour or a range."""

    tier: str
    policy: str
    count: int


@dataclass(frozen=True)
class ProcessMetrics:
    """What this process counted since it started (or forked): the source of the Prometheus view.

    `latency_counts[i]` counts limiter calls that took at most `LATENCY_BUCKETS[i]` seconds and more
    than the bucket before (the last entry: more than the largest bound). `pending` are decisions not
    yet flushed to Redis; `dropped` decisions whose per-hour or per-identity counts were lost while
    Redis was unavailable.
    """

    decisions: tuple[DecisionCount, ...]
    latency_counts: tuple[int, ...]
    latency_sum: float
    breaker_state: str
    breaker_transitions: tuple[tuple[str, int], ...]
    flushes: int
    flush_errors: int
    pending: int
    dropped: int
    last_flush: float | None
    shadow_blocked: tuple[ShadowCount, ...] = ()

    @property
    def latency_count(self) -> int:
        """Limiter calls observed."""
        return sum(self.latency_counts)


def process_metrics() -> ProcessMetrics:
    """A consistent snapshot of this process's counters."""
    recorder = _recorder
    if recorder.pid != os.getpid():
        recorder.after_fork()
    with recorder.lock:
        decisions = tuple(
            DecisionCount(tier, policy, outcome, degraded, count)
            for (tier, policy, outcome, degraded), count in sorted(recorder.totals.items())
        )
        return ProcessMetrics(
            decisions=decisions,
            latency_counts=tuple(recorder.latency_counts),
            latency_sum=recorder.latency_sum,
            breaker_state=recorder.breaker_state,
            breaker_transitions=tuple(sorted(recorder.transitions.items())),
            flushes=recorder.flushes,
            flush_errors=recorder.flush_errors,
            pending=sum(batch.size() for batch in recorder.batches.values()),
            dropped=recorder.dropped,
            last_flush=recorder.last_flush,
            shadow_blocked=tuple(ShadowCount(tier, policy, count)
                                 for (tier, policy), count in sorted(recorder.shadow_totals.items())),
        )


# -- queries (dashboard, commands) ---------------------------------------------------------------

@dataclass(frozen=True)
class _Outcomes:
    allowed: int
    blocked: int

    @property
    def total(self) -> int:
        """Allowed plus blocked decisions."""
        return self.allowed + self.blocked

    @property
    def block_rate(self) -> float:
        """Blocked / total, from 0.0 to 1.0 (0.0 when there was no traffic)."""
        return self.blocked / self.total if self.total else 0.0


@dataclass(frozen=True)
class TierCounts(_Outcomes):
    """Decisions of one tier."""

    tier: str


@dataclass(frozen=True)
class PolicyCounts:
    """Requests blocked by one policy (the policy that denied, per decision)."""

    policy: str
    blocked: int


@dataclass(frozen=True)
class BlockedIdentity:
    """An identity label ("key:<prefix>", "ip:<address>", "user:<pk>") and its blocked requests."""

    identity: str
    blocked: int


@dataclass(frozen=True)
class HourMetrics(_Outcomes):
    """The stored counts of one UTC hour (`hour` is its start, timezone-aware)."""

    hour: datetime
    degraded: int
    degraded_blocked: int
    tiers: tuple[TierCounts, ...]
    policies: tuple[PolicyCounts, ...]
    unauthorized: int = 0  # 401s: not in `total` (they were refused before any tier was known)
    allowed_by_list: int = 0  # allow rules: not in `total`
    denied_by_list: int = 0  # deny rules (403): not in `total`
    shadow: tuple[ShadowCount, ...] = ()  # would-be refusals of shadow limits, most first


@dataclass(frozen=True)
class MetricsRange(_Outcomes):
    """The stored counts of consecutive UTC hours, from `start` to `end` (both hour starts, inclusive).

    `hours` has one entry per hour, oldest first (zeros where nothing was counted); `tiers` and
    `policies` sum the range, most traffic first; `top_blocked` sums the UTC days the range touches,
    most blocked first, at most RATELIMIT['TOP_BLOCKED'] entries.
    """

    start: datetime
    end: datetime
    hours: tuple[HourMetrics, ...]
    degraded: int
    degraded_blocked: int
    tiers: tuple[TierCounts, ...]
    policies: tuple[PolicyCounts, ...]
    top_blocked: tuple[BlockedIdentity, ...]
    unauthorized: int = 0  # 401s: not in `total`
    allowed_by_list: int = 0
    denied_by_list: int = 0
    shadow: tuple[ShadowCount, ...] = ()
    top_shadow_blocked: tuple[BlockedIdentity, ...] = ()  # identities shadow limits would have blocked


def _hour_index(moment: datetime, name: str) -> int:
    if not isinstance(moment, datetime):
        raise TypeError(f"{name}: expected a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name}: {moment!r} is naive; pass a timezone-aware datetime (metrics use UTC hours)")
    return int(moment.timestamp()) // HOUR


def _hour_start(index: int) -> datetime:
    return datetime.fromtimestamp(index * HOUR, tz=timezone.utc)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _parse_hour(index: int, raw: dict[Any, Any]) -> HourMetrics:
    fields = {_text(name): int(value) for name, value in raw.items()}
    tiers: dict[str, dict[str, int]] = {}
    policies: dict[str, int] = {}
    shadow: dict[tuple[str, str], int] = {}
    for name, value in fields.items():
        kind, _, rest = name.partition(":")
        if kind == "shadow":
            tier, _, policy = rest.partition(":")
            shadow[(tier, policy)] = value
        elif kind == "tier":
            tier, _, outcome = rest.rpartition(":")
            tiers.setdefault(tier, {})[outcome] = value
        elif kind == "policy":
            policy, _, _ = rest.rpartition(":")
            policies[policy] = value
    return HourMetrics(
        allowed=fields.get("allowed", 0),
        blocked=fields.get("blocked", 0),
        hour=_hour_start(index),
        degraded=fields.get("degraded", 0),
        degraded_blocked=fields.get("degraded_blocked", 0),
        tiers=_sorted_tiers({tier: (c.get("allowed", 0), c.get("blocked", 0)) for tier, c in tiers.items()}),
        policies=_sorted_policies(policies),
        unauthorized=fields.get("unauthorized", 0),
        allowed_by_list=fields.get("allowed_by_list", 0),
        denied_by_list=fields.get("denied_by_list", 0),
        shadow=_sorted_shadow(shadow),
    )


def _sorted_shadow(counts: dict[tuple[str, str], int]) -> tuple[ShadowCount, ...]:
    return tuple(ShadowCount(tier, policy, n)
                 for (tier, policy), n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _sorted_tiers(counts: dict[str, tuple[int, int]]) -> tuple[TierCounts, ...]:
    items = [TierCounts(allowed=a, blocked=b, tier=tier) for tier, (a, b) in counts.items()]
    return tuple(sorted(items, key=lambda t: (-t.total, t.tier)))


def _sorted_policies(counts: dict[str, int]) -> tuple[PolicyCounts, ...]:
    return tuple(PolicyCounts(p, n) for p, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def get_metrics(hour: datetime | None = None) -> HourMetrics:
    """The stored counts of the UTC hour containing `hour` (timezone-aware; default: now).

    Reads Redis (one round trip); counts still in some process's memory are not included (see flush).
    """
    index = int(time.time()) // HOUR if hour is None else _hour_index(hour, "hour")
    return _read_range(index, index).hours[0]


def get_metrics_range(start: datetime, end: datetime) -> MetricsRange:
    """The stored counts of every UTC hour from the one containing `start` to the one containing `end`.

    Both are timezone-aware datetimes; at most MAX_RANGE_HOURS hours. One Redis round trip.
    """
    first, last = _hour_index(start, "start"), _hour_index(end, "end")
    if last < first:
        raise ValueError(f"end: {end.isoformat()} is before start {start.isoformat()}")
    if last - first + 1 > MAX_RANGE_HOURS:
        raise ValueError(f"range: {last - first + 1} hours requested; at most {MAX_RANGE_HOURS} are read at once")
    return _read_range(first, last)


def recent_metrics(hours: int = 48) -> MetricsRange:
    """The last `hours` UTC hours, the current one included (what the dashboard shows)."""
    if isinstance(hours, bool) or not isinstance(hours, int) or not 1 <= hours <= MAX_RANGE_HOURS:
        raise ValueError(f"hours: {hours!r} must be an integer from 1 to {MAX_RANGE_HOURS}")
    now = datetime.now(timezone.utc)
    return get_metrics_range(now - timedelta(hours=hours - 1), now)


def _read_range(first: int, last: int) -> MetricsRange:
    from .connection import get_redis

    prefix = ratelimit_settings.KEY_PREFIX
    top = int(ratelimit_settings.TOP_BLOCKED)
    days = list(range(first // 24, last // 24 + 1))
    pipe = get_redis().pipeline(transaction=False)
    for index in range(first, last + 1):
        pipe.hgetall(hour_key(prefix, index))
    for day in days:
        pipe.zrevrange(day_key(prefix, day), 0, top - 1, withscores=True)
    for day in days:
        pipe.zrevrange(shadow_day_key(prefix, day), 0, top - 1, withscores=True)
    replies = pipe.execute()
    hour_replies = zip(range(first, last + 1), replies[:last - first + 1], strict=True)
    hours = tuple(_parse_hour(index, raw or {}) for index, raw in hour_replies)
    tiers: dict[str, tuple[int, int]] = {}
    policies: dict[str, int] = {}
    for hour in hours:
        for t in hour.tiers:
            allowed, blocked = tiers.get(t.tier, (0, 0))
            tiers[t.tier] = (allowed + t.allowed, blocked + t.blocked)
        for p in hour.policies:
            policies[p.policy] = policies.get(p.policy, 0) + p.blocked
    shadow: dict[tuple[str, str], int] = {}
    for hour in hours:
        for item in hour.shadow:
            shadow[(item.tier, item.policy)] = shadow.get((item.tier, item.policy), 0) + item.count

    def top_of(replies_of_days: list[Any]) -> list[tuple[str, int]]:
        identities: dict[str, int] = {}
        for members in replies_of_days:
            for member, score in members or ():
                label = _text(member)
                identities[label] = identities.get(label, 0) + int(score)
        return sorted(identities.items(), key=lambda item: (-item[1], item[0]))[:top]

    top_blocked = top_of(replies[len(hours):len(hours) + len(days)])
    top_shadow = top_of(replies[len(hours) + len(days):])
    return MetricsRange(
        allowed=sum(h.allowed for h in hours),
        blocked=sum(h.blocked for h in hours),
        start=_hour_start(first),
        end=_hour_start(last),
        hours=hours,
        degraded=sum(h.degraded for h in hours),
        degraded_blocked=sum(h.degraded_blocked for h in hours),
        tiers=_sorted_tiers(tiers),
        policies=_sorted_policies(policies),
        top_blocked=tuple(BlockedIdentity(identity, count) for identity, count in top_blocked),
        unauthorized=sum(h.unauthorized for h in hours),
        allowed_by_list=sum(h.allowed_by_list for h in hours),
        denied_by_list=sum(h.denied_by_list for h in hours),
        shadow=_sorted_shadow(shadow),
        top_shadow_blocked=tuple(BlockedIdentity(identity, count) for identity, count in top_shadow),
    )


def days_of(metrics: MetricsRange) -> tuple[date, ...]:
    """The UTC days whose top-blocked lists `metrics.top_blocked` sums."""
    first, last = metrics.start.date(), metrics.end.date()
    return tuple(first + timedelta(days=n) for n in range((last - first).days + 1))
