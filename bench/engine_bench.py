"""Decisions per second and latency of one decision, per limiter, in 1 and N processes.

Two kinds of traffic:
- allowed: every decision is for a new identity (distinct clients), so every limiter admits it;
- denied: one hot identity, filled to its limit first, asked again and again.

A measurement runs each worker in a tight loop for `duration` seconds from a common start time and
counts decisions. Latency percentiles come from timing every call in the 1-process run. Before the
timed runs, a probe counts the Redis round trips one decision costs (commands written to a socket:
a pipeline counts once) so the tables say why a limiter is as fast as it is.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from bench.limiters import Rate
from bench.peers import BY_KEY
from bench.redis_time import redis_cpu
from bench.workers import WorkerPool, WorkerState

#: The rate every engine measurement uses; the tier variants turn it into the free tier (see tier_policies).
ENGINE_RATE = Rate(20, 60)
MODES = ("allowed", "denied")


# -- worker side ------------------------------------------------------------------------------------
def prepare(state: WorkerState, variant: str, rate: Rate, tag: str, worker: int) -> int:
    """Build the limiter and warm it up (connections, script loads) on throwaway identities; its capacity."""
    limiter = state.limiter(variant, rate)
    for i in range(20):
        limiter.hit(f"{tag}:warm:{worker}:{i}")
    return limiter.capacity


def prefill(state: WorkerState, variant: str, rate: Rate, identity: str, worker: int) -> int:
    """Hit `identity` until it is denied; how many hits were admitted."""
    limiter = state.limiter(variant, rate)
    admitted = 0
    for _ in range(limiter.capacity + 2):
        if not limiter.hit(identity):
            break
        admitted += 1
    return admitted


def count_round_trips(state: WorkerState, variant: str, rate: Rate, mode: str, tag: str, hot: str,
                      decisions: int, worker: int) -> float:
    """Average Redis round trips (packed commands written to a connection) per decision."""
    from redis.connection import AbstractConnection

    limiter = state.limiter(variant, rate)
    original = AbstractConnection.send_packed_command
    sent = [0]

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        sent[0] += 1
        original(self, command, check_health)

    AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
    try:
        for i in range(decisions):
            limiter.hit(hot if mode == "denied" else f"{tag}:probe:{i}")
    finally:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
    return sent[0] / decisions


def timed_hits(state: WorkerState, variant: str, rate: Rate, mode: str, tag: str, hot: str,
               start_at: float, duration: float, worker: int) -> dict[str, Any]:
    """Decide as fast as possible from `start_at` (time.monotonic) for `duration` seconds."""
    limiter = state.limiter(variant, rate)
    hit = limiter.hit
    clock = time.monotonic
    latencies = array("d")
    record = latencies.append
    prefix = f"{tag}:{worker}:"
    count = admitted = 0
    while clock() < start_at:
        time.sleep(0.0005)
    end = start_at + duration
    cpu_before = time.process_time()
    now = clock()
    while now < end:
        identity = hot if mode == "denied" else prefix + str(count)
        before = clock()
        if hit(identity):
            admitted += 1
        now = clock()
        record(now - before)
        count += 1
    return {"count": count, "admitted": admitted, "elapsed": now - start_at, "latencies": latencies.tobytes(),
            "cpu": time.process_time() - cpu_before}


# -- coordinator side -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One timed run: decisions per second over all processes, and latency percentiles (seconds)."""

    processes: int
    decisions: int
    admitted: int
    per_second: float
    p50: float
    p99: float
    server_cpu: float  # Redis CPU seconds (user + sys) per decision, from INFO cpu
    client_cpu: float  # CPU seconds of the deciding processes per decision (time.process_time)
    samples: tuple[float, ...] = ()  # decisions/s of every round; this run is the median one


@dataclass(frozen=True)
class EngineResult:
    """Every run of one variant in one traffic mode."""

    variant: str
    mode: str
    round_trips: float
    runs: tuple[Run, ...]

    def run(self, processes: int) -> Run | None:
        """The run with `processes` processes, if measured."""
        return next((r for r in self.runs if r.processes == processes), None)


def _percentile(values: Sequence[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]



def measure(pool: WorkerPool, admin: redis.Redis, variant: str, mode: str, processes: int, duration: float,
            tag: str, hot: str) -> Run:
    """One timed run of `variant` in `processes` workers from a common start."""
    start_at = time.monotonic() + 0.15
    kwargs = {"variant": variant, "rate": ENGINE_RATE, "mode": mode, "tag": tag, "hot": hot,
              "start_at": start_at, "duration": duration}
    cpu_before = redis_cpu(admin)
    results = pool.run({i: ("bench.engine_bench:timed_hits", {**kwargs, "worker": i}) for i in range(processes)})
    cpu = redis_cpu(admin) - cpu_before
    latencies: list[float] = []
    for result in results:
        latencies.extend(array("d", result["latencies"]))
    decisions = sum(r["count"] for r in results)
    per_second = sum(r["count"] / r["elapsed"] for r in results if r["elapsed"] > 0)
    return Run(processes, decisions, sum(r["admitted"] for r in results), per_second,
               _percentile(latencies, 0.50), _percentile(latencies, 0.99), cpu / decisions if decisions else 0.0,
               sum(r["cpu"] for r in results) / decisions if decisions else 0.0)


def _median_run(runs: list[Run]) -> Run:
    ordered = sorted(runs, key=lambda run: run.per_second)
    return dataclasses.replace(ordered[(len(ordered) - 1) // 2], samples=tuple(r.per_second for r in runs))


def run_engine(pool: WorkerPool, admin: redis.Redis, variants: Sequence[str], process_counts: Sequence[int],
               duration: float, probe: int, rounds: int, progress: Callable[[str], None]) -> list[EngineResult]:
    """The decisions/s table: every variant, both modes, every process count, in `rounds` interleaved rounds.

    Round r measures every variant once before round r+1 starts, so a disturbance of the machine hits
    one round of many variants rather than every round of one; each cell is the median round.
    """
    trips: dict[tuple[str, str], float] = {}
    for i, variant in enumerate(variants):
        progress(f"engine: preparing {i + 1}/{len(variants)}: {BY_KEY[variant].label}")
        pool.run_all("bench.engine_bench:prepare", {"variant": variant, "rate": ENGINE_RATE, "tag": f"e{i}"})
        for mode in MODES:
            admin.flushall()
            hot = f"e{i}:probe:hot"
            if mode == "denied":
                pool.run({0: ("bench.engine_bench:prefill",
                              {"variant": variant, "rate": ENGINE_RATE, "identity": hot, "worker": 0})})
            trips[(variant, mode)] = pool.run({0: ("bench.engine_bench:count_round_trips",
                                                   {"variant": variant, "rate": ENGINE_RATE, "mode": mode,
                                                    "tag": f"e{i}:probe", "hot": hot, "decisions": probe,
                                                    "worker": 0})})[0]
    samples: dict[tuple[str, str, int], list[Run]] = {}
    for r in range(rounds):
        for i, variant in enumerate(variants):
            progress(f"engine round {r + 1}/{rounds}, {i + 1}/{len(variants)}: {BY_KEY[variant].label}")
            for mode in MODES:
                admin.flushall()
                tag = f"e{i}:r{r}:{mode}"
                hot = f"{tag}:hot"
                if mode == "denied":
                    pool.run({0: ("bench.engine_bench:prefill",
                                  {"variant": variant, "rate": ENGINE_RATE, "identity": hot, "worker": 0})})
                for n in process_counts:
                    run = measure(pool, admin, variant, mode, n, duration, f"{tag}:{n}", hot)
                    samples.setdefault((variant, mode, n), []).append(run)
    admin.flushall()
    return [EngineResult(variant, mode, trips[(variant, mode)],
                         tuple(_median_run(samples[(variant, mode, n)]) for n in process_counts))
            for variant in variants for mode in MODES]


@dataclass(frozen=True)
class Paired:
    """Alternating rounds of the baselines and the tier, for the headline ratio (medians of rounds)."""

    processes: int
    rounds: int
    per_second: dict[str, float]
    samples: dict[str, tuple[float, ...]]
    cpu: dict[str, float]  # median client + Redis CPU seconds per decision

    def ratio(self, variant: str, baseline: str) -> float:
        """Median decisions/s of `variant` over that of `baseline`."""
        return self.per_second[variant] / self.per_second[baseline]


def paired_rounds(pool: WorkerPool, admin: redis.Redis, variants: Sequence[str], processes: int, rounds: int,
                  duration: float, tag: str) -> Paired:
    """Measure `variants` in turn, `rounds` times, allowed traffic; medians per variant."""
    for variant in variants:
        pool.run_all("bench.engine_bench:prepare", {"variant": variant, "rate": ENGINE_RATE, "tag": tag})
    samples: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant in variants:
            admin.flushall()
            run = measure(pool, admin, variant, "allowed", processes, duration, f"{tag}:{r}:{variant}", "")
            samples[variant].append(run.per_second)
            cpu[variant].append(run.client_cpu + run.server_cpu)
    admin.flushall()
    return Paired(processes, rounds, {v: statistics.median(s) for v, s in samples.items()},
                  {v: tuple(s) for v, s in samples.items()}, {v: statistics.median(c) for v, c in cpu.items()})
