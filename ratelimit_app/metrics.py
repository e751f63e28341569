"""Decision metrics: the stable import path (`from ratelimit_app import metrics`, `ratelimit_app.metrics.*`).

The code lives in ratelimit_app.observability, one module per job; this module re-exports their
public names:

- recorder: `record_decision`, `record_shadow_blocked`, `observe_latency` and `flush` (counted in
  process, flushed to Redis in batches by a daemon thread; never an extra round trip per request);
- schema: the Redis keys (`hour_key`, `day_key`, `shadow_day_key`, `top_candidates`);
- queries: `get_metrics`, `get_metrics_range`, `recent_metrics`, `days_of` and their dataclasses;
- snapshot: `process_metrics()` (what this process counted, for Prometheus) and `breaker_state()`
  (read from the limiter service's circuit breaker).
"""

from __future__ import annotations

from .observability.pending import MAX_PENDING_IDENTITIES
from .observability.queries import (
    MAX_RANGE_HOURS,
    BlockedIdentity,
    HourMetrics,
    MetricsRange,
    PolicyCounts,
    ShadowCount,
    TierCounts,
    days_of,
    get_metrics,
    get_metrics_range,
    recent_metrics,
)
from .observability.recorder import (
    BREAKER_STATES,
    LATENCY_BUCKETS,
    MAX_LABELS,
    NO_POLICY,
    OUTCOMES,
    flush,
    observe_latency,
    record_decision,
    record_shadow_blocked,
)
from .observability.schema import HOUR, day_key, hour_key, shadow_day_key, top_candidates
from .observability.snapshot import DecisionCount, ProcessMetrics, breaker_state, process_metrics

__all__ = [
    "BREAKER_STATES", "HOUR", "LATENCY_BUCKETS", "MAX_LABELS", "MAX_PENDING_IDENTITIES", "MAX_RANGE_HOURS",
    "NO_POLICY", "OUTCOMES", "BlockedIdentity", "DecisionCount", "HourMetrics", "MetricsRange", "PolicyCounts",
    "ProcessMetrics", "ShadowCount", "TierCounts", "breaker_state", "day_key", "days_of", "flush", "get_metrics",
    "get_metrics_range", "hour_key", "observe_latency", "process_metrics", "recent_metrics", "record_decision",
    "record_shadow_blocked", "shadow_day_key", "top_candidates",
]
