"""The limiter on a real 3-master Redis Cluster (started by a fixture): the engine's exactness tests,
no CROSSSLOT, identities spread over every shard, the service configured by a cluster URL, the
asyncio engine over redis.asyncio's cluster client, and the decision metrics' batches."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from ratelimit_app import AsyncRateLimiter, Policy, RateLimiter
from ratelimit_app.core.policies import ALGORITHMS
from ratelimit_app.core.redispy import BudgetConnection, close_client
from ratelimit_app.observability.pending import PendingCounts, SealedBatch, apply_batch
from ratelimit_app.observability.queries import recent_metrics
from ratelimit_app.observability.recorder import flush, record_decision
from ratelimit_app.service.connection import get_redis
from ratelimit_app.service.limiter import get_limiter
from tests.core.test_engine import wait_out_fixed_window
from tests.core.test_engine_async import TIGHTEST
from tests.support.topology import ClusterTopology, hammer_cluster, run_threads, start_cluster

EXACT = ["fixed_window", "sliding_window", "token_bucket", "gcra"]
T = TypeVar("T")
TIER = [
    Policy("burst", "token_bucket", limit=20, period=60, burst=10),
    Policy("minute", "sliding_window", limit=20, period=60),
    Policy("day", "fixed_window", limit=1000, period=86400),
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTopology]:
    topology = start_cluster()
    yield topology
    topology.stop()


@pytest.fixture
def cluster_client(cluster: ClusterTopology) -> Iterator[RedisCluster]:
    client = cluster.client()
    yield client
    client.close()


@pytest.fixture
def cluster_limiter(cluster_client: RedisCluster, key_prefix: str) -> RateLimiter:
    return RateLimiter(cluster_client, prefix=key_prefix)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_algorithm_admits_exactly_its_limit_then_recovers(cluster_limiter: RateLimiter, algorithm: str) -> None:
    policies = [Policy("p", algorithm, limit=5, period=2.0)]
    wait_out_fixed_window(cluster_limiter, "client", policies, margin=1.0)
    decisions = [cluster_limiter.hit("client", policies) for _ in range(7)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
    assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
    denied = decisions[-1]
    assert denied.retry_after is not None and 0 < denied.retry_after <= policies[0].state_ttl
    time.sleep(denied.retry_after)  # the wait the limiter named is enough
    assert cluster_limiter.hit("client", policies).allowed


def test_a_decision_over_every_algorithm_is_one_slot(cluster_limiter: RateLimiter,
                                                     cluster_client: RedisCluster) -> None:
    """Five policies of five algorithms in one script call: no CROSSSLOT, every key on one node."""
    policies = [Policy(f"p{i}", algorithm, limit=3, period=60) for i, algorithm in enumerate(ALGORITHMS)]
    for _ in range(3):
        assert cluster_limiter.hit("apikey:1", policies).allowed
    assert not cluster_limiter.hit("apikey:1", policies).allowed
    keys = cluster_limiter.keys("apikey:1", policies)
    assert len({cluster_client.keyslot(key) for key in keys}) == 1
    assert cluster_client.exists(*keys) == len(keys)


def test_a_denied_request_charges_no_policy(cluster_limiter: RateLimiter) -> None:
    policies = [
        Policy("burst", "token_bucket", limit=20, period=3600, burst=3),
        Policy("minute", "sliding_window", limit=20, period=60),
        Policy("day", "fixed_window", limit=1000, period=86400),
    ]
    wait_out_fixed_window(cluster_limiter, "k", policies, margin=5)
    for _ in range(3):
        assert cluster_limiter.hit("k", policies).allowed
    for _ in range(5):
        assert cluster_limiter.hit("k", policies).policy == "burst"
    after = {r.policy: r.remaining for r in cluster_limiter.peek("k", policies).results}
    assert after == {"burst": 0, "minute": 17, "day": 997}


def test_identities_spread_over_every_shard(cluster: ClusterTopology, cluster_limiter: RateLimiter,
                                            key_prefix: str) -> None:
    policies = [Policy("minute", "gcra", limit=10, period=60)]
    for n in range(300):
        assert cluster_limiter.hit(f"apikey:{n}", policies).allowed
    per_node = []
    for client in cluster.node_clients():
        per_node.append(sum(1 for _ in client.scan_iter(match=f"{key_prefix}:*", count=1000)))
        client.close()
    assert sum(per_node) == 300
    assert min(per_node) >= 50, per_node  # about 100 each: the digests spread evenly over the slots


def test_hit_many_decides_identities_on_different_slots(cluster_limiter: RateLimiter,
                                                        cluster_client: RedisCluster) -> None:
    ip = [Policy("ip", "sliding_window", limit=5, period=60)]
    key = [Policy("burst", "gcra", limit=2, period=60)]
    slots = {cluster_client.keyslot(cluster_limiter.keys(i, p)[0]) for i, p in (("ip:1.2.3.4", ip), ("key:ab", key))}
    assert len(slots) == 2
    for _ in range(2):
        assert all(d.allowed for d in cluster_limiter.hit_many([("ip:1.2.3.4", ip), ("key:ab", key)]))
    denied = cluster_limiter.hit_many([("ip:1.2.3.4", ip), ("key:ab", key)])
    assert not denied[-1].allowed and denied[-1].policy == "burst"


def test_script_flush_on_every_master_is_recovered_and_charges_once(
        cluster: ClusterTopology, cluster_limiter: RateLimiter) -> None:
    policies = [Policy("minute", "sliding_window", limit=10, period=60), Policy("day", "gcra", limit=10, period=86400)]
    assert cluster_limiter.hit("k", policies).remaining == 9
    for client in cluster.node_clients():
        client.script_flush()
        client.close()
    assert cluster_limiter.hit("k", policies).allowed
    assert [r.remaining for r in cluster_limiter.peek("k", policies).results] == [8, 8]


def test_every_written_key_expires_within_its_state_lifetime(cluster: ClusterTopology, cluster_limiter: RateLimiter,
                                                             key_prefix: str) -> None:
    policies = [Policy(f"p{i}", a, limit=4, period=30) for i, a in enumerate(ALGORITHMS)]
    for n in range(40):
        cluster_limiter.hit(f"id{n % 7}", policies, cost=1 + n % 3)
    seen = 0
    for client in cluster.node_clients():
        for key in client.scan_iter(match=f"{key_prefix}:*"):
            ttl_ms = client.pttl(key)
            assert 0 < ttl_ms <= 2 * 30 * 1000 + 50, (key, ttl_ms)
            seen += 1
        client.close()
    assert seen == 7  # one key per identity holds all its policies


def concurrent_admissions(cluster: ClusterTopology, limiter: Any, key_prefix: str, policies: list[Policy],
                          threads: int, processes: int, hits: int) -> int:
    """Hit one identity from `threads` threads here (through `limiter`) and `processes` processes of 4
    threads (each its own cluster client); return how many were admitted."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    results = context.Queue()
    ports = [node.port for node in cluster.nodes]
    children = [context.Process(target=hammer_cluster, args=(ports, key_prefix, "apikey:hot", policies, 4, hits,
                                                             start, results))
                for _ in range(processes)]
    for child in children:
        child.start()

    def one_thread(_: int) -> int:
        start.set()
        return sum(limiter.hit("apikey:hot", policies).allowed for _ in range(hits))

    admitted = sum(run_threads(threads, one_thread))
    admitted += sum(results.get(timeout=120) for _ in children)
    for child in children:
        child.join(timeout=30)
        assert child.exitcode == 0
    return admitted


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", EXACT)
def test_concurrent_clients_admit_exactly_the_tightest_limit(cluster: ClusterTopology, key_prefix: str,
                                                             algorithm: str) -> None:
    # 32 threads here plus 4 processes of 4 threads, 6 hits each: 288 hits at a tier whose tightest
    # policy allows 40. Long periods keep refills out of the count.
    client = cluster.client(max_connections=64)
    limiter = RateLimiter(client, prefix=key_prefix)
    policies = [
        Policy("tight", algorithm, limit=40, period=86400),
        Policy("minute", "sliding_window", limit=100, period=60),
        Policy("day", "fixed_window", limit=1000, period=86400),
    ]
    wait_out_fixed_window(limiter, "apikey:hot", policies, margin=60)
    assert concurrent_admissions(cluster, limiter, key_prefix, policies, threads=32, processes=4, hits=6) == 40
    assert [r.remaining for r in limiter.peek("apikey:hot", policies).results] == [0, 60, 960]
    client.close()


def test_the_service_runs_on_a_cluster_url_with_exactness(cluster: ClusterTopology, settings: Any) -> None:
    """REDIS_URL redis+cluster://... -> a RedisCluster; 32 concurrent clients of the service admit exactly."""
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": cluster.url}
    client = get_redis()
    assert isinstance(client, RedisCluster)
    # every node's connections respect the limiter's time budget
    assert {node.redis_connection.connection_pool.connection_class for node in client.get_primaries()} == {
        BudgetConnection}
    service = get_limiter()
    policies = [Policy("tight", "gcra", limit=50, period=86400),
                Policy("minute", "sliding_window", limit=500, period=60)]
    decisions = run_threads(32, lambda _: [service.hit("apikey:svc", policies) for _ in range(5)])
    flat = [d for per_thread in decisions for d in per_thread]
    assert not any(d.degraded for d in flat)
    assert sum(d.allowed for d in flat) == 50
    assert [r.remaining for r in service.peek("apikey:svc", policies).results] == [0, 450]


def test_manage_py_check_reads_the_version_of_every_node(cluster: ClusterTopology, settings: Any) -> None:
    from ratelimit_app.checks import _server_info, _server_versions, check_settings

    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": cluster.url}
    versions = _server_versions(_server_info(get_redis()))
    assert len(versions) == len(cluster.nodes) and all(versions.values())
    assert check_settings() == []


def test_the_cluster_setting_turns_a_plain_url_into_a_cluster_client(cluster: ClusterTopology, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{cluster.nodes[1].port}/0",
                          "CLUSTER": True}
    client = get_redis()
    assert isinstance(client, RedisCluster)
    assert len(client.get_primaries()) == 3


def test_check_refuses_a_cluster_node_named_as_a_single_server(cluster: ClusterTopology, settings: Any) -> None:
    from ratelimit_app.checks import check_settings

    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{cluster.nodes[1].port}/0"}
    messages = check_settings()
    assert [m.id for m in messages] == ["ratelimit.E021"] and "names a Redis Cluster node" in messages[0].msg


def test_concurrency_slots_on_a_cluster(cluster_limiter: RateLimiter, cluster_client: RedisCluster) -> None:
    """A slot is taken with the rate limits on the identity's shard and given back by ZREM there."""
    from ratelimit_app.core.engine import new_lease_token

    slots = Policy("concurrency", "concurrency", limit=2, period=60)
    tokens = [new_lease_token() for _ in range(3)]
    decisions = [cluster_limiter.hit("apikey:9", [*TIER, slots], lease=token) for token in tokens]
    assert [d.allowed for d in decisions] == [True, True, False] and decisions[2].policy == "concurrency"
    keys = cluster_limiter.keys("apikey:9", [*TIER, slots])
    assert len({cluster_client.keyslot(key) for key in keys}) == 1
    assert cluster_client.zcard(keys[-1]) == 2
    cluster_limiter.release([("apikey:9", slots)], tokens[0])
    assert cluster_client.zcard(keys[-1]) == 1
    assert cluster_limiter.hit("apikey:9", [*TIER, slots], lease=tokens[2]).allowed


# -- the asyncio engine on the same cluster ---------------------------------------------------------

def run_on_cluster(cluster: ClusterTopology, scenario: Callable[[AsyncRedisCluster], Awaitable[T]]) -> T:
    """Run `scenario(client)` in a new event loop with an asyncio cluster client of that loop."""
    async def main() -> T:
        client = AsyncRedisCluster(startup_nodes=[AsyncClusterNode("127.0.0.1", n.port) for n in cluster.nodes],
                                   socket_timeout=10, socket_connect_timeout=5, max_connections=64)
        try:
            return await scenario(client)
        finally:
            await close_client(client)

    return asyncio.run(main())


@pytest.mark.parametrize(("algorithm", "limit"), TIGHTEST)
def test_32_asyncio_tasks_admit_exactly_the_limit_of_a_three_policy_tier(cluster: ClusterTopology, key_prefix: str,
                                                                         algorithm: str, limit: int) -> None:
    from tests.core.test_engine_async import admitted_by_tasks, fixed_window_margin, tier

    policies = tier(algorithm, limit)

    async def scenario(client: AsyncRedisCluster) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix)
        await fixed_window_margin(limiter, "apikey:hot", policies, margin=60)
        assert await admitted_by_tasks(limiter, "apikey:hot", policies, tasks=32, hits=6) == limit
        assert [r.remaining for r in (await limiter.peek("apikey:hot", policies)).results] == [0, 9 * limit, 99 * limit]

    run_on_cluster(cluster, scenario)


def test_the_asyncio_engine_recovers_a_script_flush_on_every_master_and_decides_slots_in_turn(
        cluster: ClusterTopology, key_prefix: str) -> None:
    policies = [Policy("minute", "sliding_window", limit=10, period=60), Policy("day", "gcra", limit=10, period=86400)]
    ip = [Policy("ip", "sliding_window", limit=5, period=60)]
    key = [Policy("burst", "gcra", limit=2, period=60)]

    async def scenario(client: AsyncRedisCluster) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix)
        assert (await limiter.hit("k", policies)).remaining == 9
        for node in cluster.node_clients():
            node.script_flush()
            node.close()
        assert (await limiter.hit("k", policies)).allowed
        assert [r.remaining for r in (await limiter.peek("k", policies)).results] == [8, 8]
        # an IP and a key on different slots: decided one after the other, the first denial stops the rest
        assert client.keyslot(limiter.keys("ip:1", ip)[0]) != client.keyslot(limiter.keys("key:ab", key)[0])
        for _ in range(2):
            assert all(d.allowed for d in await limiter.hit_many([("ip:1", ip), ("key:ab", key)]))
        denied = await limiter.hit_many([("key:ab", key), ("ip:1", ip)])
        assert len(denied) == 1 and not denied[0].allowed and denied[0].policy == "burst"
        assert (await limiter.peek("ip:1", ip)).remaining == 3  # never asked after the key's denial

    run_on_cluster(cluster, scenario)


def test_the_async_service_runs_on_a_cluster_url_with_exactness(cluster: ClusterTopology, settings: Any) -> None:
    from ratelimit_app.service.limiter_async import get_async_limiter
    from tests.service.test_limiter_async import admitted_by_tasks

    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": cluster.url}
    service = get_async_limiter()
    policies = [Policy("tight", "gcra", limit=50, period=86400),
                Policy("minute", "sliding_window", limit=500, period=60)]

    async def scenario() -> None:
        engine = service.limiter()
        assert isinstance(engine, AsyncRateLimiter) and isinstance(engine.client, AsyncRedisCluster)
        decisions = await admitted_by_tasks(service, "apikey:async-svc", policies, tasks=32, hits=5)
        assert not any(d.degraded for d in decisions)
        assert sum(d.allowed for d in decisions) == 50
        assert [r.remaining for r in (await service.peek("apikey:async-svc", policies)).results] == [0, 450]
        await service.aclose()

    asyncio.run(scenario())


def test_decision_metrics_land_once_on_one_slot_of_a_cluster(cluster: ClusterTopology, cluster_client: RedisCluster,
                                                             settings: Any, key_prefix: str) -> None:
    """The metrics script's keys share the {metrics} hash tag: one EVALSHA on one node, and a batch sent
    again adds nothing there either."""
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": cluster.url, "METRICS_FLUSH_INTERVAL": 3600.0}
    counts = PendingCounts(key_prefix)
    counts.counts = {(int(time.time()) // 3600, "free", "minute", "blocked", False): 4}
    counts.blocked = {(int(time.time()) // 86400, "ip:192.0.2.1"): 4}
    batch = SealedBatch(counts, "cluster-writer", 1, time.time())
    assert apply_batch(cluster_client, batch, ttl=600, keep=10)
    assert not apply_batch(cluster_client, batch, ttl=600, keep=10)
    record_decision(allowed=True, tier="free", policy=None, degraded=False, identity="ip:192.0.2.1")
    assert flush()
    stored = recent_metrics(hours=2)
    assert (stored.allowed, stored.blocked) == (1, 4)
    assert [(t.identity, t.blocked) for t in stored.top_blocked] == [("ip:192.0.2.1", 4)]
