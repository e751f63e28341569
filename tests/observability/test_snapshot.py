"""ratelimit_app.observability.snapshot: `breaker_state` (read from the process' limiter service, "closed"
while RATELIMIT is invalid) and `process_metrics` (one consistent snapshot of this process' counters:
decisions per labels, pending and flushed counts, latency, would-be refusals)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from ratelimit_app.observability.recorder import (
    flush,
    observe_latency,
    process_recorder,
    record_decision,
    record_shadow_blocked,
)
from ratelimit_app.observability.snapshot import DecisionCount, breaker_state, process_metrics
from ratelimit_app.service.limiter import get_limiter


def test_breaker_state_is_the_services_own_and_closed_while_settings_are_invalid(settings: Any) -> None:
    breaker = get_limiter().guard.breaker
    for _ in range(breaker.failures):
        breaker.record_failure("down")
    assert breaker_state() == "open"
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "ajar"}  # no service can be built now
    assert breaker_state() == "closed"
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "open"}
    assert breaker_state() == "closed"  # a settings change builds a new service, with a new breaker
    assert get_limiter().guard.breaker is not breaker


def test_a_snapshot_holds_the_decisions_by_labels_and_what_is_not_flushed_yet(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_FLUSH_INTERVAL": 3600.0}
    process_recorder.shutdown()  # the flusher stops (after one last flush); the next decision starts a new
    # one, which waits the new interval: from here on only the test flushes
    tier = f"t{uuid.uuid4().hex[:8]}"  # labels no other test counts
    before = process_metrics()
    for _ in range(3):
        record_decision(allowed=True, tier=tier, policy=None, degraded=False, identity="ip:192.0.2.1")
    record_decision(allowed=False, tier=tier, policy="minute", degraded=True, identity="ip:192.0.2.1")
    record_shadow_blocked(tier=tier, policies=("dry", "drier"), identity="ip:192.0.2.1")
    snapshot = process_metrics()
    mine = [d for d in snapshot.decisions if d.tier == tier]
    assert mine == [DecisionCount(tier, "minute", "blocked", True, 1), DecisionCount(tier, "none", "allowed", False, 3)]
    assert [(s.policy, s.count) for s in snapshot.shadow_blocked if s.tier == tier] == [("drier", 1), ("dry", 1)]
    assert snapshot.pending - before.pending == 4
    assert flush()
    after = process_metrics()
    assert after.pending == 0 and after.flushes == snapshot.flushes + 1
    assert after.last_flush is not None and after.last_flush <= time.time()
    assert [d for d in after.decisions if d.tier == tier] == mine  # totals since the process started stay


def test_latency_is_counted_in_its_bucket_and_in_total() -> None:
    before = process_metrics()
    observe_latency(0.0003)
    observe_latency(0.2)
    observe_latency(99.0)
    after = process_metrics()
    assert after.latency_count == before.latency_count + 3 == sum(after.latency_counts)
    grown = [i for i, (a, b) in enumerate(zip(before.latency_counts, after.latency_counts, strict=True)) if a != b]
    assert grown == [0, 8, len(after.latency_counts) - 1]  # <= 0.5 ms, <= 0.25 s, above the largest bound
    assert after.latency_sum - before.latency_sum == pytest.approx(0.0003 + 0.2 + 99.0)
