"""Accuracy under concurrency: 32 clients (threads across processes) race for one identity's limit.

Each client sends `hits` requests as fast as it can from a common start; the limit is 100 per hour
(for our 3-policy tier: a tier whose tightest policy admits 100). Admitted above the limit is
over-admission. Nothing refills noticeably within a run (one unit per 36 s at the fastest), and a
run never starts within a few seconds of an hour boundary, so for an exact algorithm any admission
above the limit is a real race, not a window edge.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import redis

from bench.limiters import Rate
from bench.peers import BY_KEY
from bench.workers import WorkerPool, WorkerState

#: Limit of the accuracy runs for single-policy limiters.
ACCURACY_RATE = Rate(100, 3600)
#: The tier variants get twice that, which makes their tightest policy (the burst) exactly 100.
TIER_ACCURACY_RATE = Rate(200, 3600)


def accuracy_rate(variant: str) -> Rate:
    """The rate `variant` runs with in the accuracy test."""
    return TIER_ACCURACY_RATE if BY_KEY[variant].policies > 1 else ACCURACY_RATE


# -- worker side ------------------------------------------------------------------------------------
def prepare(state: WorkerState, variant: str, rate: Rate, tag: str, worker: int) -> int:
    """Build and warm the limiter on throwaway identities; its capacity."""
    limiter = state.limiter(variant, rate)
    for i in range(5):
        limiter.hit(f"{tag}:warm:{worker}:{i}")
    return limiter.capacity


def concurrent_clients(state: WorkerState, variant: str, rate: Rate, identity: str, threads: int, hits: int,
                       start_at: float, worker: int) -> int:
    """`threads` clients each hit `identity` `hits` times from `start_at` (time.monotonic); admitted total."""
    limiter = state.limiter(variant, rate)
    admitted = [0] * threads

    def client(slot: int) -> None:
        while time.monotonic() < start_at:
            time.sleep(0.0005)
        for _ in range(hits):
            if limiter.hit(identity):
                admitted[slot] += 1

    clients = [threading.Thread(target=client, args=(slot,)) for slot in range(threads)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    return sum(admitted)


# -- coordinator side -------------------------------------------------------------------------------
@dataclass(frozen=True)
class AccuracyResult:
    """Admitted per run for one variant; `limit` is what an exact limiter admits."""

    variant: str
    limit: int
    attempts: int
    admitted: tuple[int, ...]

    @property
    def over_admission(self) -> int:
        """The worst run's admissions above the limit (0 when no run over-admitted)."""
        return max(0, max(self.admitted) - self.limit)


def _away_from_hour_boundary(margin: float = 5.0) -> None:
    into_hour = time.time() % 3600
    if into_hour > 3600 - margin:
        time.sleep(3600 - into_hour + 0.5)


def run_accuracy(pool: WorkerPool, admin: redis.Redis, variant: str, clients: int, hits: int, runs: int,
                 tag: str) -> AccuracyResult:
    """`runs` races of `clients` clients (spread over the pool's processes) on one identity."""
    rate = accuracy_rate(variant)
    limit = pool.run_all("bench.accuracy:prepare", {"variant": variant, "rate": rate, "tag": tag})[0]
    per_worker = [clients // pool.size + (1 if i < clients % pool.size else 0) for i in range(pool.size)]
    admitted = []
    for run in range(runs):
        admin.flushall()
        _away_from_hour_boundary()
        start_at = time.monotonic() + 0.2
        identity = f"{tag}:race:{run}"
        results = pool.run({
            i: ("bench.accuracy:concurrent_clients",
                {"variant": variant, "rate": rate, "identity": identity, "threads": n, "hits": hits,
                 "start_at": start_at, "worker": i})
            for i, n in enumerate(per_worker) if n
        })
        admitted.append(sum(results))
    admin.flushall()
    return AccuracyResult(variant, limit, clients * hits, tuple(admitted))
