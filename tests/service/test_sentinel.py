"""The limiter behind Redis Sentinel (one master, one replica, three sentinels, started by a fixture):
master discovery, exactness, and a failover during traffic."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

from ratelimit_app import Decision, Policy
from ratelimit_app.core.redispy import BudgetSentinelConnection
from ratelimit_app.core.scripts import decide_source
from ratelimit_app.service.connection import get_redis
from ratelimit_app.service.limiter import LimiterService, get_limiter
from tests.support.topology import SentinelTopology, run_threads, start_sentinel_topology, wait_for

BUDGET_MS = 50


@pytest.fixture(scope="module")
def topology() -> Iterator[SentinelTopology]:
    started = start_sentinel_topology()
    yield started
    started.stop()


def exact_admissions(service: LimiterService, identity: str, limit: int) -> list[Decision]:
    """32 concurrent clients, 5 hits each, at a limit below the 160 hits; return every decision."""
    policies = [Policy("tight", "gcra", limit=limit, period=86400),
                Policy("minute", "sliding_window", limit=1000, period=60)]
    per_thread = run_threads(32, lambda _: [service.hit(identity, policies) for _ in range(5)])
    return [decision for decisions in per_thread for decision in decisions]


def test_the_master_is_found_through_the_sentinels_and_counts_exactly(topology: SentinelTopology,
                                                                       settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": topology.url}
    client = get_redis()
    assert isinstance(client, redis.Redis) and isinstance(client.connection_pool, SentinelConnectionPool)
    assert client.connection_pool.connection_class is BudgetSentinelConnection
    decisions = exact_admissions(get_limiter(), "apikey:sentinel", limit=40)
    assert not any(d.degraded for d in decisions)
    assert sum(d.allowed for d in decisions) == 40
    assert client.connection_pool.get_master_address() == ("127.0.0.1", topology.master_port())


def test_a_failover_during_traffic_follows_the_fail_mode_then_counts_exactly(
        topology: SentinelTopology, settings: Any) -> None:
    settings.RATELIMIT = {
        **settings.RATELIMIT, "REDIS_URL": topology.url, "FAIL_MODE": "closed", "BUDGET_MS": BUDGET_MS,
        "SOCKET_CONNECT_TIMEOUT": 0.05, "SOCKET_TIMEOUT": 0.05, "BREAKER_FAILURES": 3,
        "BREAKER_COOLDOWN": 0.2, "BREAKER_MAX_COOLDOWN": 1.0,
    }
    service = get_limiter()
    for port in (topology.master.port, topology.replica.port):  # a cold first call could spend the budget
        preload = redis.Redis(port=port, socket_timeout=5)
        preload.script_load(decide_source())
        preload.close()
    wait_for(lambda: not service.hit("warm-up", [Policy("p", "gcra", limit=1000, period=60)]).degraded, 10,
             "a first decision within the budget")
    policies = [Policy("minute", "sliding_window", limit=100_000, period=60)]
    stop = threading.Event()
    seen: list[tuple[Decision, float]] = []
    lock = threading.Lock()

    def traffic(index: int) -> None:
        # each client sends about a request per millisecond (unpaced, the breaker's microsecond answers
        # would pile up millions of samples, and collecting them would stall the very calls we time)
        while not stop.wait(0.001):
            started = time.perf_counter()
            decision = service.hit(f"client:{index}", policies)
            took = time.perf_counter() - started
            with lock:
                seen.append((decision, took))

    threads = [threading.Thread(target=traffic, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(seen) > 200, 10, "traffic before the failover")
        old = topology.kill_master()
        wait_for(lambda: topology.master_port() != old, 30, "the sentinels to promote the replica", interval=0.1)
        # decisions are normal again as soon as the breaker's probe reaches the new master
        wait_for(lambda: not seen[-1][0].degraded and not service.hit("probe", policies).degraded, 15,
                 "normal decisions after the failover")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    decisions = [decision for decision, _ in seen]
    durations = [took for _, took in seen]
    # during the switch: either a normal decision, or what "closed" answers (refused, degraded, Retry-After)
    assert all(not d.degraded or (not d.allowed and d.retry_after) for d in decisions)
    assert any(d.degraded for d in decisions), "the failover was not visible: the test proves nothing"
    p99 = statistics.quantiles(durations, n=100)[98]
    assert p99 <= (BUDGET_MS + 100) / 1000, f"p99 {p99 * 1000:.1f} ms over the budget"
    assert max(durations) <= 1.0, f"a call took {max(durations):.3f} s"
    # exactness is back: 32 concurrent clients on the new master admit exactly the limit (timeouts that
    # a loaded test machine cannot miss, so that every decision is Redis')
    settings.RATELIMIT = {**settings.RATELIMIT, "BUDGET_MS": 5000, "SOCKET_TIMEOUT": 5.0,
                          "SOCKET_CONNECT_TIMEOUT": 2.0}
    after = exact_admissions(get_limiter(), "apikey:after-failover", limit=40)
    assert not any(d.degraded for d in after)
    assert sum(d.allowed for d in after) == 40


def test_the_async_service_finds_the_master_through_the_sentinels_and_counts_exactly(
        topology: SentinelTopology, settings: Any) -> None:
    import asyncio

    from ratelimit_app.service.limiter_async import get_async_limiter
    from tests.service.test_limiter_async import admitted_by_tasks

    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": topology.url}
    service = get_async_limiter()
    policies = [Policy("tight", "gcra", limit=40, period=86400),
                Policy("minute", "sliding_window", limit=1000, period=60)]

    async def scenario() -> list[Decision]:
        try:
            return await admitted_by_tasks(service, "apikey:async-sentinel", policies, tasks=32, hits=5)
        finally:
            await service.aclose()

    decisions = asyncio.run(scenario())
    assert not any(d.degraded for d in decisions)
    assert sum(d.allowed for d in decisions) == 40
