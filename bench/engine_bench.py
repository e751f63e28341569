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

from bench.peers import BY_KEY, Rate
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


def _redis_cpu(admin: redis.Redis) -> float:
    cpu = admin.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def measure(pool: WorkerPool, admin: redis.Redis, variant: str, mode: str, processes: int, duration: float,
            tag: str, hot: str) -> Run:
    """One timed run of `variant` in `processes` workers from a common start."""
    start_at = time.monotonic() + 0.15
    kwargs = {"variant": variant, "rate": ENGINE_RATE, "mode": mode, "tag": tag, "hot": hot,
              "start_at": start_at, "duration": duration}
    cpu_before = _redis_cpu(admin)
    results = pool.run({i: ("bench.engine_bench:timed_hits", {**kwargs, "worker": i}) for i in range(processes)})
    cpu = _redis_cpu(admin) - cpu_before
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




# -- the engine's transports, side by side --------------------------------------------------------------
#: Rows of the transport comparison: the sync engine on each path, the async engine, and a bare EVALSHA
#: from the same client for each (the floor each is judged against).
TRANSPORTS = {
    "sync.evalsha": "sync: bare EVALSHA (client.evalsha)",
    "sync.tier": "sync: RateLimiter.hit, 3-policy tier, per-thread connection (speed path)",
    "sync.tier.pool": "sync: RateLimiter.hit, 3-policy tier, client's pool (reference path)",
    "async.evalsha": "async: bare EVALSHA (await client.evalsha)",
    "async.tier": "async: AsyncRateLimiter.hit, 3-policy tier, own connections (speed path)",
    "async.tier.pool": "async: AsyncRateLimiter.hit, 3-policy tier, client's pool (reference path)",
}
_sync_transports: dict[str, Callable[[str], Any]] = {}


def _sync_transport(state: WorkerState, variant: str) -> Callable[[str], Any]:
    """The call one sync row makes per decision, built once per worker process."""
    found = _sync_transports.get(variant)
    if found is None:
        from bench.peers import INCR_SCRIPT, tier_policies
        from ratelimit_app import RateLimiter

        client = state.ctx.client
        if variant == "sync.evalsha":
            sha = client.script_load(INCR_SCRIPT)
            found = lambda identity: client.evalsha(sha, 1, "bl:" + identity)  # noqa: E731
        else:
            limiter = RateLimiter(client, prefix="tr", connections="pool" if variant == "sync.tier.pool"
                                  else "own")
            policies = tier_policies(ENGINE_RATE)
            found = lambda identity: limiter.hit(identity, policies)  # noqa: E731
        _sync_transports[variant] = found
    return found


def _async_transports(client: Any) -> dict[str, Callable[..., Any]]:
    """The coroutine function each async row awaits per decision, all over one redis.asyncio client."""
    from bench.peers import INCR_SCRIPT, tier_policies
    from ratelimit_app import AsyncRateLimiter

    policies = tier_policies(ENGINE_RATE)
    own = AsyncRateLimiter(client, prefix="tr")
    pooled = AsyncRateLimiter(client, prefix="tr", connections="pool")
    shas: list[str] = []

    async def evalsha(identity: str) -> Any:
        return await client.evalsha(shas[0], 1, "bl:" + identity)

    async def tier(identity: str) -> Any:
        return await own.hit(identity, policies)

    async def tier_pool(identity: str) -> Any:
        return await pooled.hit(identity, policies)

    async def load() -> None:
        shas.append(await client.script_load(INCR_SCRIPT))

    return {"async.evalsha": evalsha, "async.tier": tier, "async.tier.pool": tier_pool, "": load}


def interleaved_transports(state: WorkerState, keys: list[str], duration: float, burst: int, slices: int,
                           tag: str, worker: int) -> dict[str, Any]:
    """Every row of `keys` ("<row>/<tasks>") in turn, `burst` decisions per task at a time, for `duration`
    seconds; per row: decisions, wall time, this process' CPU and Redis' CPU, also per time slice.

    Interleaving in short bursts (rather than rounds of a second) puts every row under the same load
    from other work on the machine, which a shared machine changes from one second to the next.
    """
    import asyncio

    import redis.asyncio

    loop = asyncio.new_event_loop()
    client = redis.asyncio.Redis.from_url(state.ctx.url, socket_timeout=10, socket_connect_timeout=5)
    admin = state.ctx.client
    try:
        coroutines = _async_transports(client)
        loop.run_until_complete(coroutines.pop("")())
        totals: dict[str, dict[str, Any]] = {
            key: {"count": 0, "wall": 0.0, "cpu": 0.0, "redis": 0.0, "slices": [[0, 0.0] for _ in range(slices)]}
            for key in keys}

        def run_burst(key: str, first: int) -> int:
            row, n = key.rsplit("/", 1)
            tasks = int(n)
            if row.startswith("sync."):
                decide = _sync_transport(state, row)
                for i in range(burst):
                    decide(f"{tag}:{key}:{first + i}")
                return burst
            decide_async = coroutines[row]

            async def one(start: int) -> None:
                for i in range(burst):
                    await decide_async(f"{tag}:{key}:{start + i}")

            async def all_tasks() -> None:
                await asyncio.gather(*(one(first + t * burst) for t in range(tasks)))

            loop.run_until_complete(all_tasks())
            return burst * tasks

        for key in keys:  # warm up: connections, scripts
            run_burst(key, -10_000)
        started = time.monotonic()
        end = started + duration
        counter = 0
        while time.monotonic() < end:
            admin.flushall()  # as the rounds of the main table do: every cycle starts from an empty Redis
            for key in keys:
                redis_before = _redis_cpu(admin)
                cpu_before, wall_before = time.process_time(), time.perf_counter()
                done = run_burst(key, counter)
                wall = time.perf_counter() - wall_before
                cpu = time.process_time() - cpu_before
                total = totals[key]
                total["redis"] += _redis_cpu(admin) - redis_before
                total["count"] += done
                total["wall"] += wall
                total["cpu"] += cpu
                part = total["slices"][min(slices - 1, int((time.monotonic() - started) / duration * slices))]
                part[0] += done
                part[1] += wall
                counter += done
        return totals
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


@dataclass(frozen=True)
class Transports:
    """Every transport row, interleaved in short bursts in one process for `duration` seconds.

    Keys are "<row>/<tasks>": a sync row runs in 1 thread ("sync.tier/1"), an async row in each of
    `tasks` concurrent tasks ("async.tier/16"). `per_second` is decisions over the row's own time;
    `samples` the same in each of `rounds` equal slices of the run (how steady it was); `cpu` the
    client's plus Redis' CPU per decision.
    """

    rounds: int
    duration: float
    tasks: tuple[int, ...]
    per_second: dict[str, float]
    samples: dict[str, tuple[float, ...]]
    cpu: dict[str, float]

    def ratio(self, row: str, floor: str) -> float:
        """Median decisions/s of `row` over that of `floor` (keys as above)."""
        return self.per_second[row] / self.per_second[floor]


def transport_rounds(pool: WorkerPool, admin: redis.Redis, duration: float, tasks: Sequence[int] = (1, 16),
                     burst: int = 20, slices: int = 5, rows: Sequence[str] = tuple(TRANSPORTS)) -> Transports:
    """Measure `rows` of TRANSPORTS (default: all) in worker 0, interleaved in bursts for `duration` seconds."""
    keys = [f"{row}/1" for row in rows if row.startswith("sync.")]
    keys += [f"{row}/{n}" for n in tasks for row in rows if row.startswith("async.")]
    admin.flushall()
    [totals] = pool.run({0: ("bench.engine_bench:interleaved_transports",
                             {"keys": keys, "duration": duration, "burst": burst, "slices": slices, "tag": "tr",
                              "worker": 0})})
    admin.flushall()
    return Transports(slices, duration, tuple(tasks),
                      {key: t["count"] / t["wall"] for key, t in totals.items()},
                      {key: tuple(n / w for n, w in t["slices"] if w > 0) for key, t in totals.items()},
                      {key: (t["cpu"] + t["redis"]) / max(t["count"], 1) for key, t in totals.items()})
