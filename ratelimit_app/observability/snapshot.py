"""What this process counted, as one consistent snapshot (the source of the Prometheus series); the breaker's
state is read from the limiter service that owns it, never a copy."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

from ..service.breaker import CLOSED
from ..service.limiter import get_limiter
from .queries import ShadowCount, UsageCount
from .recorder import process_recorder


@dataclass(frozen=True)
class DecisionCount:
    """Decisions counted by this process since it started, for one combination of labels."""

    tier: str
    policy: str
    outcome: str  # "allowed", "blocked", "unauthorized", "allowed_by_list" or "denied_by_list"
    degraded: bool
    count: int


@dataclass(frozen=True)
class ProcessMetrics:
    """What this process counted since it started (or forked): the source of the Prometheus view."""

    decisions: tuple[DecisionCount, ...]
    #: [i]: limiter calls that took at most LATENCY_BUCKETS[i] seconds and more than the bucket before
    #: (the last entry: more than the largest bound)
    latency_counts: tuple[int, ...]
    latency_sum: float
    breaker_state: str  # of the limiter service's circuit breaker when the snapshot was taken
    breaker_transitions: tuple[tuple[str, int], ...]
    flushes: int
    flush_errors: int
    pending: int  # decisions not yet flushed to Redis
    dropped: int  # decisions whose per-hour or per-identity counts were lost while Redis was unavailable
    last_flush: float | None
    shadow_blocked: tuple[ShadowCount, ...] = ()
    usage: tuple[UsageCount, ...] = ()

    @property
    def latency_count(self) -> int:
        """Limiter calls observed."""
        return sum(self.latency_counts)


def breaker_state() -> str:
    """The state of the circuit breaker of this process's limiter service: "closed", "open" or "half_open"
    ("closed" while RATELIMIT is invalid: no service, no breaker, exists)."""
    try:
        service = get_limiter()
    except ImproperlyConfigured:  # reported by `manage.py check` and by the request path
        return CLOSED
    return service.stats().breaker.state


def process_metrics() -> ProcessMetrics:
    """A consistent snapshot of this process's counters, with the breaker's current state."""
    state = breaker_state()
    recorder = process_recorder
    recorder.check_fork()
    with recorder.lock:
        decisions = tuple(
            DecisionCount(tier, policy, outcome, degraded, count)
            for (tier, policy, outcome, degraded), count in sorted(recorder.totals.items())
        )
        return ProcessMetrics(
            decisions=decisions,
            latency_counts=tuple(recorder.latency_counts),
            latency_sum=recorder.latency_sum,
            breaker_state=state,
            breaker_transitions=tuple(sorted(recorder.transitions.items())),
            flushes=recorder.flushes,
            flush_errors=recorder.flush_errors,
            pending=recorder.pending(),
            dropped=recorder.dropped,
            last_flush=recorder.last_flush,
            shadow_blocked=tuple(ShadowCount(tier, policy, count)
                                 for (tier, policy), count in sorted(recorder.shadow_totals.items())),
            usage=tuple(UsageCount(tier, policy, unit, count)
                        for (tier, policy, unit), count in sorted(recorder.usage_totals.items())),
        )
