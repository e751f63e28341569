"""The stores the harness runs against, each with the faults that belong to it.

- `Standalone`: one redis-server or valkey-server (devtools.embedded), reached through a FaultProxy;
- `SentinelStore`: a master, a replica and three sentinels (tests/support/topology.py);
- `ClusterStore`: three masters sharing the 16384 slots (tests/support/topology.py).

`nodes()` are plain clients of every server that holds keys now, for the harness's own reads (keys
without a TTL, the metrics): never the app's connections.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import redis

from devtools.embedded import RedisProcess, redis_server_binary, start_redis, valkey_server_binary
from tests.support.topology import ClusterTopology, SentinelTopology, start_cluster, start_sentinel_topology, wait_for

from .proxy import FaultProxy


def server_version(port: int) -> str:
    with redis.Redis(port=port, socket_timeout=5, decode_responses=True) as client:
        info = client.info("server")
    name = "Valkey" if "valkey_version" in info else "Redis"
    return f"{name} {info.get('valkey_version') or info['redis_version']}"


class Standalone:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        binary = valkey_server_binary() if kind == "valkey" else redis_server_binary()
        self.server: RedisProcess = start_redis(binary=binary)
        self.proxy = FaultProxy("127.0.0.1", self.server.port)
        self.url = self.proxy.url
        self.version = server_version(self.server.port)

    def nodes(self) -> list[redis.Redis]:
        return [redis.Redis(port=self.server.port, socket_timeout=10, decode_responses=True)]

    def kill_and_restart(self, down: float) -> None:
        """SIGKILL the server, and start it again empty on the same port `down` seconds later."""
        self.server.process.kill()
        self.server.process.wait()
        time.sleep(down)
        self.server.restart()

    def pause(self, seconds: float) -> None:
        """SIGSTOP the server for `seconds`, then SIGCONT."""
        self.server.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            self.server.process.send_signal(signal.SIGCONT)

    def network(self, seconds: float, mode: str, **options: Any) -> None:
        """Put the proxy in `mode` (with `options`: delay, loss, resets) for `seconds`, then forward again."""
        for name, value in options.items():
            setattr(self.proxy, name, value)
        self.proxy.mode = mode
        try:
            time.sleep(seconds)
        finally:
            self.proxy.mode = "forward"

    def stop(self) -> None:
        self.proxy.close()
        if self.server.process.poll() is None:
            self.server.process.send_signal(signal.SIGCONT)
        self.server.stop()


class SentinelStore:
    kind = "sentinel"

    def __init__(self) -> None:
        self.topology: SentinelTopology = start_sentinel_topology(service="faults")
        self.url = self.topology.url
        self.version = f"{server_version(self.topology.master.port)} (master, replica, 3 sentinels)"

    def nodes(self) -> list[redis.Redis]:
        return [redis.Redis(port=self.topology.master_port(), socket_timeout=10, decode_responses=True)]

    def failover(self) -> None:
        """SIGKILL the master; return once the sentinels name the replica as the new master."""
        old = self.topology.kill_master()
        wait_for(lambda: self.topology.master_port() != old, 30, "the sentinels to promote the replica",
                 interval=0.1)

    def stop(self) -> None:
        self.topology.stop()


class ClusterStore:
    kind = "cluster"

    def __init__(self) -> None:
        self.topology: ClusterTopology = start_cluster()
        self.url = self.topology.url
        self.version = f"{server_version(self.topology.nodes[0].port)} (3 masters)"

    def nodes(self) -> list[redis.Redis]:
        return [redis.Redis(port=node.port, socket_timeout=10, decode_responses=True) for node in self.topology.nodes]

    def _owner_of(self, prefix: str) -> int:
        """The index of a master that holds keys under `prefix` (the first one found)."""
        for index, client in enumerate(self.nodes()):
            if next(client.scan_iter(match=f"{prefix}:*", count=1000), None) is not None:
                return index
        return 0

    def kill_master(self, prefix: str, down: float) -> None:
        """SIGKILL a master holding the run's keys; start it again empty (same nodes.conf: its slots)
        `down` seconds later; return once the cluster agrees it is whole again."""
        node = self.topology.nodes[self._owner_of(prefix)]
        node.process.kill()
        node.process.wait()
        time.sleep(down)
        node.restart()
        wait_for(self._healthy, 60, "the cluster to be whole again", interval=0.1)

    def _healthy(self) -> bool:
        return all(client.cluster("info").get("cluster_state") == "ok" for client in self.nodes())

    def reshard(self, prefix: str) -> int:
        """Move every slot holding keys under `prefix` to the next master, keys migrated while the load
        runs (SETSLOT IMPORTING / MIGRATING, MIGRATE, SETSLOT NODE); the number of slots moved."""
        clients = self.nodes()
        ids = [client.execute_command("CLUSTER MYID") for client in clients]
        plan = sorted({(int(client.execute_command("CLUSTER KEYSLOT", key)), source)
                       for source, client in enumerate(clients) for key in client.scan_iter(match=f"{prefix}:*",
                                                                                            count=1000)})
        for slot, source in plan:  # planned first: a slot moves once, never on around the ring
            self._move(clients, ids, slot, source, (source + 1) % len(clients))
        return len(plan)

    def _move(self, clients: list[redis.Redis], ids: list[str], slot: int, source: int, target: int) -> None:
        port = self.topology.nodes[target].port
        clients[target].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
        clients[source].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target])
        while keys := clients[source].execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
            clients[source].execute_command("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)
        for client in clients:
            client.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])

    def stop(self) -> None:
        self.topology.stop()


def start_store(kind: str) -> Standalone | SentinelStore | ClusterStore:
    if kind in ("redis", "valkey"):
        return Standalone(kind)
    return SentinelStore() if kind == "sentinel" else ClusterStore()
