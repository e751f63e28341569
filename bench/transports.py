"""The engine's transports: the sync engine on both paths and the async engine, each against a bare
EVALSHA from the same client, in one worker process (`transport_rounds`, which `bench/run.py` runs in
sections 1 and 6). Run alone, it prints those rows as the Markdown of docs/benchmarks.md:

    python bench/transports.py [--duration 20] [--tasks 1 16]

Starts its own redis-server on a free loopback port and one worker process, like bench/run.py,
in the current environment (the peers are not needed). A full `bench/run.py` includes the same rows.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.engine_bench import ENGINE_RATE  # noqa: E402
from bench.redis_time import redis_cpu  # noqa: E402
from bench.report_text import ENGINE_TARGET, Target, num, spread, table, times, usec  # noqa: E402
from bench.workers import WorkerPool, WorkerState  # noqa: E402

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
        from bench.limiters import INCR_SCRIPT, tier_policies
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
    from bench.limiters import INCR_SCRIPT, tier_policies
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
                redis_before = redis_cpu(admin)
                cpu_before, wall_before = time.process_time(), time.perf_counter()
                done = run_burst(key, counter)
                wall = time.perf_counter() - wall_before
                cpu = time.process_time() - cpu_before
                total = totals[key]
                total["redis"] += redis_cpu(admin) - redis_before
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
    [totals] = pool.run({0: ("bench.transports:interleaved_transports",
                             {"keys": keys, "duration": duration, "burst": burst, "slices": slices, "tag": "tr",
                              "worker": 0})})
    admin.flushall()
    return Transports(slices, duration, tuple(tasks),
                      {key: t["count"] / t["wall"] for key, t in totals.items()},
                      {key: tuple(n / w for n, w in t["slices"] if w > 0) for key, t in totals.items()},
                      {key: (t["cpu"] + t["redis"]) / max(t["count"], 1) for key, t in totals.items()})


# -- the rows as Markdown (docs/benchmarks.md) ------------------------------------------------------------
def transport_targets(transports: Transports | None) -> list[Target]:
    """The async engine's target: AsyncRateLimiter.hit on the tier >= 0.9x a bare async EVALSHA."""
    if transports is None:
        return [Target(f"AsyncRateLimiter.hit, 3-policy tier >= {ENGINE_TARGET}x one bare async EVALSHA",
                       "paired rounds", "not run", "not measured")]
    targets = []
    for n in transports.tasks:
        tier, floor = f"async.tier/{n}", f"async.evalsha/{n}"
        ratio = transports.ratio(tier, floor)
        targets.append(Target(
            f"AsyncRateLimiter.hit, 3-policy tier >= {ENGINE_TARGET}x one bare async EVALSHA, {n} task(s)",
            f"1 process, {transports.duration:g} s of allowed traffic interleaved in bursts, same client",
            f"{num(transports.per_second[tier])} vs {num(transports.per_second[floor])} decisions/s = {times(ratio)}; "
            f"by CPU per decision (client + Redis) {times(transports.cpu[floor] / transports.cpu[tier])}",
            "pass" if ratio >= ENGINE_TARGET else "miss",
            spread(transports.samples[tier], transports.samples[floor])))
    return targets


def transport_section(transports: Transports) -> list[str]:
    """The table of the engine's transports (bench/engine_bench.py: transport_rounds)."""
    lines = ["### The engine's transports, paired", "",
             "The sync engine on both of its paths and the async engine, each next to a bare EVALSHA of the "
             "INCR script from the same kind of client, in one worker process for "
             f"{transports.duration:g} s, allowed traffic (a new identity per decision). The rows take turns "
             "in bursts of 20 decisions per thread or task (Redis flushed before each turn of all rows), so that "
             "every row meets the same load from other work on the machine; decisions/s is each row's "
             "decisions over its own time, and *each fifth* the same over each fifth of the run. A sync row "
             "decides in one thread; an "
             "async row in N concurrent tasks of one event loop over one `redis.asyncio.Redis`. "
             "The speed paths are the defaults (`RateLimiter`: a connection per thread; `AsyncRateLimiter`: "
             "connections of its own, one per decision in flight); the *pool* paths are the reference paths "
             "(`connections=\"pool\"`; for `RateLimiter` the default under gevent/eventlet).", ""]
    return lines + transport_table(transports)


def transport_table(transports: Transports, prefix: str = "") -> list[str]:
    """One row per measured transport row (those whose name starts with `prefix`) and thread / task
    count, next to its bare EVALSHA."""
    rows = []
    floors = {"sync.tier": "sync.evalsha", "sync.tier.pool": "sync.evalsha", "async.tier": "async.evalsha",
              "async.tier.pool": "async.evalsha"}
    for key, per_second in transports.per_second.items():
        row, n = key.rsplit("/", 1)
        if not row.startswith(prefix):
            continue
        floor = floors.get(row)
        rows.append([TRANSPORTS[row], n, num(per_second),
                     times(transports.ratio(key, f"{floor}/{n}")) if floor else "",
                     usec(transports.cpu[key]), " / ".join(num(v) for v in transports.samples[key])])
    return table(["row", "threads / tasks", "decisions/s", "vs the bare EVALSHA", "CPU µs per decision "
                   "(client + Redis)", "each fifth /s"], rows, "lrrrrl")



def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/transports.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of interleaved traffic (default 20)")
    parser.add_argument("--tasks", type=int, nargs="+", default=[1, 16], help="concurrent tasks of the async rows")
    args = parser.parse_args(argv)
    from bench.report_text import targets_table
    from bench.workers import WorkerPool
    from devtools.embedded import start_redis

    server = start_redis()
    os.environ["BENCH_REDIS_URL"] = server.url
    admin = redis.Redis.from_url(server.url, socket_timeout=60)
    load_before = f"{os.getloadavg()[0]:.2f}"
    started = time.monotonic()
    try:
        pool = WorkerPool(1, server.url)
        try:
            transports = transport_rounds(pool, admin, args.duration, args.tasks)
        finally:
            pool.close()
    finally:
        server.stop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"`python bench/transports.py {' '.join(argv)}`".replace(" `", "`") + f" at {commit}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, took {time.monotonic() - started:.0f} s; "
          f"load average (1 min) {load_before} / {os.getloadavg()[0]:.2f}.\n")
    print("\n".join(targets_table(transport_targets(transports))))
    print("\n".join(transport_section(transports)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
