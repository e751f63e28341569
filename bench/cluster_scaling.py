"""Decisions per second of the free tier on a Redis Cluster of 1, 2 and 3 masters (docs/scaling.md).

    python bench/cluster_scaling.py [--processes 4] [--seconds 3] [--rounds 3]

For each cluster size it starts that many cluster-enabled redis-servers on free loopback ports
(tests/support/topology.py, no replicas), then `--processes` client processes each decide the free tier
(token_bucket + sliding_window + fixed_window) for new identities through `RateLimiter` on a
`RedisCluster` client, as fast as they can, for `--seconds`. It reports decisions per second (the
median of `--rounds` rounds), the share of the decisions each master ran (how the identities' slots
spread the work) and each master's EVALSHA usec_per_call (INFO commandstats). Client processes and
Redis servers share this machine's cores: the scaling it shows is bounded by those cores, not by Redis.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
from redis.cluster import ClusterNode, RedisCluster

from ratelimit_app import Policy, RateLimiter
from tests.support.topology import start_cluster

TIER = [
    Policy("burst", "token_bucket", limit=20, period=60, burst=10),
    Policy("minute", "sliding_window", limit=20, period=60),
    Policy("day", "fixed_window", limit=1000, period=86400),
]


def _decide(ports: list[int], tag: str, seconds: float, start: Any, results: Any) -> None:
    client = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port) for port in ports], socket_timeout=30)
    limiter = RateLimiter(client, prefix="scale")
    for i in range(200):  # warm up: connections to every master, the script loaded on each
        limiter.hit(f"{tag}:warm:{i}", TIER)
    start.wait()
    deadline = time.monotonic() + seconds
    done = 0
    while time.monotonic() < deadline:
        for _ in range(50):
            limiter.hit(f"{tag}:{done}", TIER)
            done += 1
    client.close()
    results.put(done)


def _evalsha_stats(ports: list[int]) -> list[tuple[int, float]]:
    """(EVALSHA calls, usec_per_call) of each master since its last CONFIG RESETSTAT."""
    stats = []
    for port in ports:
        entry = redis.Redis(port=port).info("commandstats").get("cmdstat_evalsha", {})
        stats.append((int(entry.get("calls", 0)), float(entry.get("usec_per_call", 0.0))))
    return stats


def measure(masters: int, processes: int, seconds: float, rounds: int) -> dict[str, Any]:
    """Decisions/s (median round) and Redis CPU us per decision, per master, on a fresh cluster."""
    cluster = start_cluster(masters)
    ports = [node.port for node in cluster.nodes]
    context = multiprocessing.get_context("spawn")
    rates, stats = [], []
    try:
        for round_index in range(rounds):
            start, results = context.Event(), context.Queue()
            workers = [context.Process(target=_decide, args=(ports, f"r{round_index}p{p}", seconds, start, results))
                       for p in range(processes)]
            for worker in workers:
                worker.start()
            time.sleep(2.0)  # every worker connected and warmed up
            for port in ports:
                redis.Redis(port=port).config_resetstat()
            start.set()
            total = sum(results.get(timeout=seconds + 120) for _ in workers)
            stats.append(_evalsha_stats(ports))
            for worker in workers:
                worker.join()
            rates.append(total / seconds)
    finally:
        cluster.stop()
    middle = sorted(range(rounds), key=lambda r: rates[r])[rounds // 2]
    return {"masters": masters, "rates": rates, "median": rates[middle], "stats": stats[middle]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--masters", type=int, nargs="*", default=[1, 2, 3])
    args = parser.parse_args()
    print(f"free tier, new identities, {args.processes} client processes, {args.seconds:g} s x {args.rounds} rounds")
    print("| masters | decisions/s (median) | each round | share of the decisions per master | "
          "EVALSHA usec_per_call per master |")
    for masters in args.masters:
        result = measure(masters, args.processes, args.seconds, args.rounds)
        calls = sum(c for c, _ in result["stats"]) or 1
        print(f"| {masters} | {result['median']:,.0f} | {' / '.join(f'{r:,.0f}' for r in result['rates'])} | "
              f"{' / '.join(f'{c / calls:.0%}' for c, _ in result['stats'])} | "
              f"{' / '.join(f'{u:.1f}' for _, u in result['stats'])} |", flush=True)
    print(f"machine: {multiprocessing.cpu_count()} cores")


if __name__ == "__main__":
    main()
