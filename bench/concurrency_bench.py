"""What a concurrency slot costs over HTTP: rate limits alone against rate limits plus a slot, under gunicorn.

    python3 bench/concurrency_bench.py [--duration 5] [--warmup 1] [--rounds 5] [--connections 8]
                                       [--workers 2] [--threads 4] [--write]

One gunicorn (gthread) serves bench.httpapp with RateLimitMiddleware ("ours" variant of
bench/httpapp/variants.py) against a private redis-server. Two API keys, side by side in the same
server and the same rounds (their order alternates each round), each request sending the next of
KEY_COUNT keys of its tier:

- "rate limits": the seeded enterprise tier as migrate makes it (token_bucket + sliding_window +
  fixed_window) plus the per-IP limit: one EVALSHA per request;
- "rate limits + slot": a copy of that tier plus a concurrency limit (huge slots, 60 s leases), as
  staff add one in the admin: the slot is taken in the same EVALSHA and given back by one ZREM when
  the response is closed.

Each row is the median round by requests per second; the ratio is given both as the ratio of those
medians and as the median of the per-round ratios (the two variants of one round run back to back, so
a disturbance of the machine hits both). CPU per request is measured too, less sensitive to other
load on the machine: the gunicorn workers' (from /proc) and Redis' (INFO cpu). Round trips per request
are counted from the server's INFO commandstats (EVALSHA, ZREM, and all commands). Nothing is denied
(each key stays within its limits for a round); the report says how many answers were not 200.
Results go to stdout as a Markdown table; --write also puts them into docs/benchmarks.md as the
section "concurrency" (kept there when bench/run.py writes the rest of the file again).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.http_bench import SEEDED_TIER, Server, connections_per_worker, prepare_with_slot  # noqa: E402
from bench.loadgen import HttpResult, load_generator  # noqa: E402
from bench.redis_time import redis_cpu  # noqa: E402
from devtools.embedded import start_redis  # noqa: E402

VARIANTS = (("rate limits", SEEDED_TIER), ("rate limits + slot", f"{SEEDED_TIER}-slot"))


def prepare(redis_url: str, db_path: Path) -> dict[str, list[str]]:
    return prepare_with_slot(redis_url, db_path, "ours")



def _commands(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--write", action="store_true", help="put the results into docs/benchmarks.md")
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]

    redis_server = start_redis()
    admin = redis.Redis.from_url(redis_server.url)
    work_dir = Path(tempfile.mkdtemp(prefix="ratelimit-concurrency-bench-"))
    keys = prepare(redis_server.url, work_dir / "db.sqlite3")
    generator_name, generate = load_generator()
    results: dict[str, list[HttpResult]] = {label: [] for label, _ in VARIANTS}
    trips: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _ in VARIANTS}
    cpu: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in VARIANTS}
    with Server(redis_server.url, work_dir / "db.sqlite3", "ours", args.workers, args.threads,
                connections=args.connections) as server:
        for label, slug in VARIANTS:
            status, _ = server.wait_ready({"X-API-Key": keys[slug][0]})
            if status != 200:
                raise RuntimeError(f"{label}: first answer was {status}, expected 200")
        for round_index in range(args.rounds):
            order = VARIANTS if round_index % 2 == 0 else tuple(reversed(VARIANTS))
            for label, slug in order:
                admin.flushdb()  # the private server's sliding logs stay small; the scripts stay loaded
                generate(server.url, keys[slug], args.connections, args.warmup)
                before = _commands(admin)
                app_before, redis_before = server.worker_cpu(), redis_cpu(admin)
                result = generate(server.url, keys[slug], args.connections, args.duration)
                app_after, redis_after = server.worker_cpu(), redis_cpu(admin)
                after = _commands(admin)
                done = max(1, result.requests)
                cpu[label].append(((app_after - app_before) / done, (redis_after - redis_before) / done))
                delta = {name: after.get(name, 0) - before.get(name, 0) for name in after}
                trips[label].append((delta.get("evalsha", 0) / done, delta.get("zrem", 0) / done,
                                     sum(delta.values()) / done))
                results[label].append(result)
                print(f"round {round_index + 1}/{args.rounds} {label}: {result.per_second:.0f} req/s "
                      f"({result.errors} not 200)", file=sys.stderr)
    redis_server.stop()
    lines: list[str] = []
    out = lines.append

    out(f"gunicorn gthread, {args.workers} workers x {args.threads} threads, each worker holding at most "
          f"{connections_per_worker(args.connections, args.workers)} of the connections; load: {generator_name}, "
          f"{args.connections} connections, {args.rounds} rounds of {args.duration:g} s (median round); "
          f"{os.cpu_count()} cores")
    out("")
    out("| request | req/s (median) | rounds (req/s) | p50 ms | p99 ms | not 200 | EVALSHA/req | ZREM/req | "
          "Redis commands/req (scripts' included) | app CPU ms/req | Redis CPU us/req |")
    out("|---|---|---|---|---|---|---|---|---|---|---|")
    medians: dict[str, float] = {}
    for label, _ in VARIANTS:
        ordered = sorted(results[label], key=lambda r: r.per_second)
        middle = ordered[(len(ordered) - 1) // 2]
        medians[label] = middle.per_second
        evalsha = statistics.median(t[0] for t in trips[label])
        zrem = statistics.median(t[1] for t in trips[label])
        commands = statistics.median(t[2] for t in trips[label])
        rounds = ", ".join(f"{r.per_second:.0f}" for r in results[label])
        app_cpu = statistics.median(c[0] for c in cpu[label]) * 1000
        redis_us = statistics.median(c[1] for c in cpu[label]) * 1_000_000
        out(f"| {label} | {middle.per_second:.0f} | {rounds} | {middle.p50 * 1000:.2f} | {middle.p99 * 1000:.2f} | "
              f"{sum(r.errors for r in results[label])} | {evalsha:.3f} | {zrem:.3f} | {commands:.3f} | "
              f"{app_cpu:.3f} | {redis_us:.1f} |")
    ratio = medians["rate limits + slot"] / medians["rate limits"]
    paired = statistics.median(s.per_second / r.per_second
                               for r, s in zip(results["rate limits"], results["rate limits + slot"], strict=True))
    out("")
    out(f"rate limits + slot / rate limits: {ratio:.2f}x (medians), {paired:.2f}x (median of the per-round "
        "ratios); target >= 0.8x")
    print("\n".join(lines))
    if args.write:
        _write_section(lines, load_at_start, os.getloadavg()[0])
    return 0


def _write_section(lines: list[str], load_at_start: float, load_at_end: float) -> None:
    from bench.report_text import write_script_section

    write_script_section("concurrency", "## 7. Concurrency slots over HTTP", "bench/concurrency_bench.py", [
        "One gunicorn serves the trivial view behind RateLimitMiddleware; two API keys take turns",
        "in every round: keys of the seeded enterprise tier (3 rate limits), and keys of a copy of it",
        "plus a concurrency limit (huge slots, 60 s leases). The slot is taken in the request's one",
        "EVALSHA and given back by one ZREM when the response is closed: two round trips instead of one.",
        "Target: the pair keeps >= 0.8x the requests per second of the rate-limited request.",
    ], lines, load_at_start, load_at_end)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
