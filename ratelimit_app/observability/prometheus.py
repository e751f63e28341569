"""Prometheus exposition of this process's limiter metrics (opt-in: include `ratelimit_app.urls`).

GET /metrics (`metrics_view`, from ratelimit_app.observability.metrics_endpoint) serves `exposition()`:
the Prometheus text format of a dedicated `CollectorRegistry` (`registry`), so nothing else registered with
prometheus-client's global registry leaks in, and the app's series never collide with a project's own.
Importing this module without prometheus-client raises ImproperlyConfigured. Series (all per process):

- `ratelimit_decisions_total{tier,policy,outcome}` counter: limited requests; `outcome` is "allowed",
  "blocked" or "unauthorized" (401), `policy` the policy that denied ("none" otherwise).
  "allowed_by_list" / "denied_by_list" (an allow or deny rule decided, without Redis).
- `ratelimit_degraded_decisions_total{tier,outcome}` counter: those decided without Redis.
- `ratelimit_shadow_blocked_total{tier,policy}` counter: allowed requests that a shadow (dry-run)
  limit would have refused.
- `ratelimit_limiter_latency_seconds` histogram: duration of limiter calls to Redis.
- `ratelimit_breaker_state{state}` gauge: 1 for the breaker's current state, 0 for the others.
- `ratelimit_breaker_transitions_total{state}` counter: changes into each state.
- `ratelimit_metrics_flushes_total{result}` counter, `ratelimit_metrics_pending` and
  `ratelimit_metrics_dropped_total`: health of the batched flush of counts to Redis.

Counters are per process, as with any Prometheus client library: under gunicorn with several workers
each worker counts its own share. Cluster-wide hourly totals live in Redis (`ratelimit_app.observability`,
the dashboard, `manage.py ratelimit_metrics`).

The view is not public: it answers only to staff sessions, to `Authorization: Bearer
<RATELIMIT['METRICS_TOKEN']>` and to client IPs in RATELIMIT['METRICS_ALLOWED_IPS'] (403 otherwise;
see ratelimit_app.observability.metrics_endpoint).
"""

from __future__ import annotations

from collections.abc import Iterator

from django.core.exceptions import ImproperlyConfigured

from .metrics_endpoint import metrics_view
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
    by_labels: dict[tuple[str, str, str], int] = {}
    degraded_by_labels: dict[tuple[str, str], int] = {}
    for item in snapshot.decisions:
        key = (item.tier, item.policy, item.outcome)
        by_labels[key] = by_labels.get(key, 0) + item.count
        if item.degraded:
            degraded_key = (item.tier, item.outcome)
            degraded_by_labels[degraded_key] = degraded_by_labels.get(degraded_key, 0) + item.count
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


class RateLimitCollector(Collector):
    """Builds the series listed in the module docstring from `process_metrics()` (observability.snapshot)."""

    def collect(self) -> Iterator[Metric]:
        snapshot = process_metrics()
        for series in (_decision_series, _latency_series, _breaker_series, _flush_series):
            yield from series(snapshot)


#: The registry `metrics_view` serves; register your own collectors elsewhere.
registry = CollectorRegistry(auto_describe=True)
registry.register(RateLimitCollector())


def exposition() -> bytes:
    """The series of `registry` in the Prometheus text format (content type `CONTENT_TYPE_LATEST`)."""
    return bytes(generate_latest(registry))


__all__ = ["CONTENT_TYPE_LATEST", "RateLimitCollector", "exposition", "metrics_view", "registry"]
