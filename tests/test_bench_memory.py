"""bench/memory.py counts an identity once, however many Redis keys it holds (section 3 of docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from bench.limiters import Rate
from bench.memory import run_memory
from bench.workers import WorkerPool
from devtools.embedded import RedisProcess
from ratelimit_app import Policy, RateLimiter
from ratelimit_app.core.keys import state_keys

LONG_LOG = Rate(2000, 60)  # a long exact sliding log: the identity's key and the log's own key
IDENTITIES = 3


@pytest.fixture
def bench_pool(server: RedisProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerPool]:
    """One bench worker on the test's own Redis (run_memory flushes it), with the bench settings."""
    monkeypatch.setenv("BENCH_REDIS_URL", server.url)
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "bench.httpapp.settings")
    pool = WorkerPool(1, server.url)
    yield pool
    pool.close()


def test_a_long_log_identity_is_counted_once_with_all_its_keys(server: RedisProcess, bench_pool: WorkerPool) -> None:
    admin = redis.Redis.from_url(server.url)

    result = run_memory(bench_pool, admin, "ours.sliding_window", LONG_LOG, IDENTITIES, hit_budget=10_000,
                        unit_budget=1_000_000, tag="t")

    # what one identity filled the same way holds: MEMORY USAGE of every key of its state
    policy = Policy("limit", "sliding_window", limit=LONG_LOG.limit, period=LONG_LOG.period)
    RateLimiter(admin, prefix="rl").hit("alone", [policy], cost=LONG_LOG.limit)
    keys = set(state_keys("rl", "alone", [policy])) | {k.decode() for k in admin.scan_iter("rl:*")}
    assert len(keys) == 2
    alone = sum(int(admin.memory_usage(key, samples=0) or 0) for key in keys)
    admin.close()

    assert (result.identities, result.live_identities, result.filled_to) == (IDENTITIES, IDENTITIES, LONG_LOG.limit)
    assert result.verified_full
    assert abs(result.memory_usage_per_identity - alone) <= 8, (result.memory_usage_per_identity, alone)
