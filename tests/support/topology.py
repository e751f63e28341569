"""Real Redis topologies for tests: a 3-master Redis Cluster, and a master + replica + 3 sentinels.

Every process is a redis-server started here on free loopback ports, in its own temporary
directory, and stopped by `stop()` (the test fixtures call it). Nothing touches the shared Redis.
Readiness is polled with a deadline, never slept on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from devtools.embedded import RedisProcess, answers, free_port, redis_server_binary, start_redis

HASH_SLOTS = 16384


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll `condition` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except (redis.RedisError, OSError) as exc:
            last_error = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


def command_calls(client: redis.Redis, command: str) -> int:
    """How many times the server ran `command` successfully (INFO commandstats: calls - failed_calls;
    an EVALSHA answered NOSCRIPT ran nothing), 0 when never."""
    stats = client.info("commandstats").get(f"cmdstat_{command.lower()}", {})
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


# -- Redis Cluster -------------------------------------------------------------------------------

@dataclass
class ClusterTopology:
    """Three masters sharing the 16384 slots, no replicas."""

    nodes: list[RedisProcess]

    @property
    def url(self) -> str:
        """A redis+cluster:// URL naming every node (any one of them is enough to start)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def client(self, **options: Any) -> RedisCluster:
        """A plain cluster client for assertions (generous timeouts)."""
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", n.port) for n in self.nodes],
                            socket_timeout=10, socket_connect_timeout=5, **options)

    def node_clients(self) -> list[redis.Redis]:
        """One plain client per master."""
        return [redis.Redis(port=n.port, socket_timeout=10) for n in self.nodes]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def free_cluster_port() -> int:
    """A free port P whose cluster bus port P + 10000 is free too (works with any Redis version)."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of ports (P, P + 10000) for a cluster node")


def start_cluster(masters: int = 3, timeout: float = 30.0) -> ClusterTopology:
    """Start `masters` cluster-enabled redis-servers, give each an equal share of slots, join them."""
    nodes: list[RedisProcess] = []
    try:
        for _ in range(masters):
            nodes.append(start_redis(port=free_cluster_port(), extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
            )))
        clients = [redis.Redis(port=n.port, socket_timeout=10) for n in nodes]
        share = HASH_SLOTS // masters
        for index, client in enumerate(clients):
            first = index * share
            last = HASH_SLOTS - 1 if index == masters - 1 else first + share - 1
            client.execute_command("CLUSTER ADDSLOTS", *range(first, last + 1))
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", "127.0.0.1", nodes[0].port)

        def ready() -> bool:
            for client in clients:
                info = client.cluster("info")
                if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != masters:
                    return False
                if int(info.get("cluster_slots_ok", 0)) != HASH_SLOTS:
                    return False
            return True

        wait_for(ready, timeout, "the cluster to agree on its slots")
        for client in clients:
            client.close()
        return ClusterTopology(nodes)
    except BaseException:
        for node in nodes:
            node.stop()
        raise


# -- Sentinel ------------------------------------------------------------------------------------

def start_sentinel(master_port: int, service: str, timeout: float = 10.0) -> RedisProcess:
    """Start one sentinel watching 127.0.0.1:`master_port` as `service` (quorum 2)."""
    port = free_port()
    directory = tempfile.mkdtemp(prefix="ratelimit-sentinel-")
    config = os.path.join(directory, "sentinel.conf")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(
            f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
            f"sentinel monitor {service} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {service} 1000\n"
            f"sentinel failover-timeout {service} 5000\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
    process = subprocess.Popen([redis_server_binary(), config, "--sentinel"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sentinel = RedisProcess(port, process, directory)
    deadline = time.monotonic() + timeout
    while not answers("127.0.0.1", port):
        if process.poll() is not None or time.monotonic() > deadline:
            sentinel.stop()
            raise RuntimeError(f"sentinel on port {port} did not start")
        time.sleep(0.02)
    return sentinel


@dataclass
class SentinelTopology:
    """One master, one replica, three sentinels (quorum 2) watching them as `service`."""

    master: RedisProcess
    replica: RedisProcess
    sentinels: list[RedisProcess]
    service: str = "rlmaster"
    killed: list[RedisProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def sentinel_client(self, index: int = 0) -> redis.Redis:
        return redis.Redis(port=self.sentinels[index].port, socket_timeout=5, decode_responses=True)

    def master_port(self) -> int:
        """The port of the master the first sentinel names now."""
        client = self.sentinel_client()
        try:
            _, port = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)
            return int(port)
        finally:
            client.close()

    def kill_master(self) -> int:
        """SIGKILL the current master (no goodbye to clients or sentinels); returns its port."""
        port = self.master_port()
        victim = self.master if self.master.port == port else self.replica
        victim.process.kill()
        victim.process.wait()
        self.killed.append(victim)
        return port

    def stop(self) -> None:
        for process in [*self.sentinels, self.replica, self.master]:
            process.stop()


def start_sentinel_topology(service: str = "rlmaster", timeout: float = 30.0) -> SentinelTopology:
    """Start the master, its replica and three sentinels; return once the sentinels know them all."""
    started: list[RedisProcess] = []
    try:
        master = start_redis()
        started.append(master)
        replica = start_redis(extra_args=("--replicaof", "127.0.0.1", str(master.port)))
        started.append(replica)
        replica_client = redis.Redis(port=replica.port, socket_timeout=5)
        wait_for(lambda: replica_client.info("replication").get("master_link_status") == "up", timeout,
                 "the replica to sync")
        replica_client.close()
        sentinels = []
        for _ in range(3):
            sentinels.append(start_sentinel(master.port, service))
            started.append(sentinels[-1])
        topology = SentinelTopology(master, replica, sentinels, service)

        def sentinels_agree() -> bool:
            for index in range(3):
                client = topology.sentinel_client(index)
                try:
                    state = client.execute_command("SENTINEL MASTER", service)
                finally:
                    client.close()
                fields = dict(zip(state[::2], state[1::2], strict=True)) if isinstance(state, list) else state
                if int(fields["num-slaves"]) < 1 or int(fields["num-other-sentinels"]) < 2:
                    return False
            return True

        wait_for(sentinels_agree, timeout, "the sentinels to see the replica and each other", interval=0.1)
        return topology
    except BaseException:
        for process in started:
            process.stop()
        raise


# -- traffic helpers -----------------------------------------------------------------------------

def run_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Run target(i) on `count` threads released together; return their results in order."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait()
            results[index] = target(index)
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def hammer_cluster(ports: list[int], prefix: str, identity: str, policies: list[Any], threads: int, hits: int,
                   start: Any, results: Any) -> None:
    """Process entry point: hit `identity` on the cluster of `ports` from `threads` threads; put admitted."""
    from ratelimit_app import RateLimiter

    client = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port) for port in ports], socket_timeout=30)
    limiter = RateLimiter(client, prefix=prefix)
    start.wait()
    admitted = run_threads(threads, lambda _: sum(limiter.hit(identity, policies).allowed for _ in range(hits)))
    client.close()
    results.put(sum(admitted))
