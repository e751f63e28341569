"""GET /metrics' Prometheus text of this process's counters, from a registry of its own (nothing else
registered with prometheus-client leaks in). The series: docs/observability.md. Importing this module
without prometheus-client raises ImproperlyConfigured."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from django.core.exceptions import ImproperlyConfigured

from .recorder import BREAKER_STATES, LATENCY_BUCKETS
from .snapshot import ProcessMetrics, process_metrics

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImproperlyConfigured(
        "ratelimit_app.observability.prometheus needs prometheus-client: pip install prometheus-client "
        "(or install this package with its [prometheus] extra)"
    ) from exc


def _decision_series(snapshot: ProcessMetrics) -> Iterator[Metric]:
    decisions = CounterMetricFamily(
        "ratelimit_decisions", "Rate-limited requests decided by this process.",
        labels=["tier", "policy", "outcome"],
    )
    degraded = CounterMetricFamily(
        "ratelimit_degraded_decisions", "Requests decided without Redis (fail mode), by this process.",
        labels=["tier", "outcome"],
    )
    by_labels: Counter[tuple[str, str, str]] = Counter()
    degraded_by_labels: Counter[tuple[str, str]] = Counter()
    for item in snapshot.decisions:
        by_labels[(item.tier, item.policy, item.outcome)] += item.count
        if item.degraded:
            degraded_by_labels[(item.tier, item.outcome)] += item.count
    for labels, count in sorted(by_labels.items()):
        decisions.add_metric(list(labels), count)
    for degraded_labels, count in sorted(degraded_by_labels.items()):
        degraded.add_metric(list(degraded_labels), count)
    yield decisions
    yield degraded
    shadow = CounterMetricFamily(
        "ratelimit_shadow_blocked", "Allowed requests a shadow (dry-run) limit would have refused.",
        labels=["tier", "policy"],
    )
    for would_block in snapshot.shadow_blocked:
        shadow.add_metric([would_block.tier, would_block.policy], would_block.count)
    yield shadow
    usage = CounterMetricFamily(
        "ratelimit_usage_units", "Units used under usage limits (what requests settled), by this process.",
        labels=["tier", "policy", "unit"],
    )
    for used in snapshot.usage:
        usage.add_metric([used.tier, used.policy, used.unit], used.count)
    yield usage


def _latency_series(snapshot: ProcessMetrics) -> Iterator[Metric]:
    cumulative = 0
    buckets: list[tuple[str, float]] = []
    for bound, count in zip((*LATENCY_BUCKETS, float("inf")), snapshot.latency_counts, strict=True):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    yield HistogramMetricFamily(
        "ratelimit_limiter_latency_seconds", "Duration of limiter calls to Redis.",
        buckets=buckets, sum_value=snapshot.latency_sum,
    )


def _breaker_series(snapshot: ProcessMetrics) -> Iterator[Metric]:
    state = GaugeMetricFamily("ratelimit_breaker_state", "Circuit breaker in front of Redis: 1 marks "
                              "the current state.", labels=["state"])
    for name in BREAKER_STATES:
        state.add_metric([name], 1.0 if name == snapshot.breaker_state else 0.0)
    yield state
    transitions = CounterMetricFamily("ratelimit_breaker_transitions", "Circuit breaker changes into "
                                      "each state.", labels=["state"])
    counted = dict(snapshot.breaker_transitions)
    for name in BREAKER_STATES:
        transitions.add_metric([name], counted.get(name, 0))
    yield transitions


def _flush_series(snapshot: ProcessMetrics) -> Iterator[Metric]:
    flushes = CounterMetricFamily("ratelimit_metrics_flushes", "Batched writes of decision counts to "
                                  "Redis.", labels=["result"])
    flushes.add_metric(["ok"], snapshot.flushes)
    flushes.add_metric(["error"], snapshot.flush_errors)
    yield flushes
    yield GaugeMetricFamily("ratelimit_metrics_pending", "Decisions counted but not yet flushed to Redis.",
                            value=snapshot.pending)
    yield CounterMetricFamily("ratelimit_metrics_dropped", "Decision counts lost while Redis was "
                              "unavailable (memory bound or expired hours).", value=snapshot.dropped)


class _RateLimitCollector(Collector):
    """The series of docs/observability.md, from `process_metrics()` (observability.snapshot)."""

    def collect(self) -> Iterator[Metric]:
        snapshot = process_metrics()
        for series in (_decision_series, _latency_series, _breaker_series, _flush_series):
            yield from series(snapshot)


#: The registry GET /metrics serves; register your own collectors elsewhere.
registry = CollectorRegistry(auto_describe=True)
registry.register(_RateLimitCollector())


def exposition() -> tuple[bytes, str]:
    """The series of `registry` in the Prometheus text format, and its content type."""
    return bytes(generate_latest(registry)), CONTENT_TYPE_LATEST
