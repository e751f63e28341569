"""Redis memory per active identity: fill many identities to their limit, then ask Redis.

For each limiter and rate (20/min and 2,000/min) the Redis is flushed, N identities are charged up
to their limit (with the library's cost/weight argument where it has one, else by repeated hits),
and two numbers are taken: the sum of `MEMORY USAGE key SAMPLES 0` over every key, and the growth
of `INFO memory` used_memory (what the server really allocated, overheads included), each divided
by the number of identities whose state is still live: the keys left divided by the keys one identity
holds, counted on a probe identity filled alone first (a long exact sliding log of ours holds two, its
identity's key and the log's own key; a fixed window that ends during the run takes its keys with it;
the table shows live / filled). N is 10,000 identities unless filling
them would take more than the work budget (limiters without a cost argument need a hit per unit;
log-based state writes a member per unit); then N is smaller and the table says so. Each worker
checks that the last identity it filled is denied right after filling it (the fill really reached
the limit).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from bench.limiters import Rate
from bench.peers import BY_KEY
from bench.workers import WorkerPool, WorkerState

MEMORY_RATES = (Rate(20, 60), Rate(2000, 60))


# -- worker side ------------------------------------------------------------------------------------
def fill_range(state: WorkerState, variant: str, rate: Rate, tag: str, start: int, stop: int, worker: int) -> bool:
    """Fill identities `tag:start` .. `tag:stop-1` to their limit; True when the last one is then denied.

    The check runs right after that identity's fill, before a refilling algorithm (token bucket,
    GCRA) can earn a new unit back.
    """
    limiter = state.limiter(variant, rate)
    for i in range(start, stop):
        limiter.fill(f"{tag}:{i}")
    return not limiter.hit(f"{tag}:{stop - 1}")


def fill_one(state: WorkerState, variant: str, rate: Rate, identity: str, worker: int) -> None:
    """Fill the one identity `identity` to its limit (the probe that counts the keys an identity holds)."""
    state.limiter(variant, rate).fill(identity)


def warm(state: WorkerState, variant: str, rate: Rate, tag: str, worker: int) -> int:
    """Build the limiter and make one decision (loads scripts); its capacity."""
    limiter = state.limiter(variant, rate)
    limiter.hit(f"{tag}:warm:{worker}")
    return limiter.capacity


# -- coordinator side -------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryResult:
    """Bytes per live identity for one limiter at one rate; `identities` were filled to `filled_to` units,
    each holding `keys_per_identity` Redis keys."""

    variant: str
    rate: Rate
    identities: int
    live_identities: int
    filled_to: int
    keys_per_identity: int
    memory_usage_per_identity: float
    used_memory_per_identity: float
    verified_full: bool


def identities_for(variant: str, capacity: int, max_identities: int, hit_budget: int, unit_budget: int) -> int:
    """How many identities to fill within the work budgets (see the module docstring)."""
    spec = BY_KEY[variant]
    count = max_identities
    if spec.fill_by_hits:
        count = min(count, hit_budget // (capacity + 1))
    if spec.state_per_unit:
        count = min(count, unit_budget // capacity)
    return max(1, count)


def _memory_usage(admin: redis.Redis) -> tuple[int, int]:
    keys = list(admin.scan_iter(count=1000))
    total = 0
    for start in range(0, len(keys), 1000):
        pipe = admin.pipeline(transaction=False)
        for key in keys[start:start + 1000]:
            pipe.memory_usage(key, samples=0)
        total += sum(int(size or 0) for size in pipe.execute())
    return len(keys), total


def run_memory(pool: WorkerPool, admin: redis.Redis, variant: str, rate: Rate, max_identities: int,
               hit_budget: int, unit_budget: int, tag: str) -> MemoryResult:
    """Measure one limiter at one rate (see the module docstring)."""
    capacity = pool.run_all("bench.memory:warm", {"variant": variant, "rate": rate, "tag": tag})[0]
    count = identities_for(variant, capacity, max_identities, hit_budget, unit_budget)
    admin.flushall()
    pool.run({0: ("bench.memory:fill_one", {"variant": variant, "rate": rate, "identity": f"{tag}:probe",
                                            "worker": 0})})
    keys_per_identity = int(admin.dbsize())
    admin.flushall()
    before = int(admin.info("memory")["used_memory"])
    chunk = -(-count // pool.size)
    verified = pool.run({
        i: ("bench.memory:fill_range", {"variant": variant, "rate": rate, "tag": tag, "start": i * chunk,
                                        "stop": min(count, (i + 1) * chunk), "worker": i})
        for i in range(pool.size) if i * chunk < count
    })
    # SCAN first: it drops keys that expired during the fill, so used_memory counts live state only
    keys, usage = _memory_usage(admin)
    after = int(admin.info("memory")["used_memory"])
    admin.flushall()
    live = keys / keys_per_identity if keys_per_identity else 0.0
    return MemoryResult(variant, rate, count, round(live), capacity, keys_per_identity,
                        usage / live if live else float("nan"), (after - before) / live if live else float("nan"),
                        all(verified))
