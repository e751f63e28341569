"""Only the engine's transports: the sync engine on both paths and the async engine, each against a bare
EVALSHA from the same client (the part of `bench/run.py` that bench/engine_bench.py's
`transport_rounds` measures), printed as the Markdown of docs/benchmarks.md.

    python bench/transports.py [--duration 20] [--tasks 1 16]

Starts its own redis-server on a free loopback port and one worker process, like bench/run.py,
in the current environment (the peers are not needed). A full `bench/run.py` includes the same rows.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/transports.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of interleaved traffic (default 20)")
    parser.add_argument("--tasks", type=int, nargs="+", default=[1, 16], help="concurrent tasks of the async rows")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import redis

    from bench import engine_bench, report
    from bench.runner import load_average
    from bench.workers import WorkerPool
    from devtools.embedded import start_redis

    server = start_redis()
    os.environ["BENCH_REDIS_URL"] = server.url
    admin = redis.Redis.from_url(server.url, socket_timeout=60)
    load_before = load_average()
    started = time.monotonic()
    try:
        pool = WorkerPool(1, server.url)
        try:
            transports = engine_bench.transport_rounds(pool, admin, args.duration, args.tasks)
        finally:
            pool.close()
    finally:
        server.stop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    print(f"`python bench/transports.py {' '.join(argv)}`".replace(" `", "`") + f" at {commit}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, took {time.monotonic() - started:.0f} s; "
          f"load average (1 min) {load_before} / {load_average()}.\n")
    targets = report.transport_targets(transports)
    print("\n".join(report._table(["target", "how it is judged", "measured", "result"],
                                  [[t.promise, t.rule, t.measured, t.status] for t in targets], "llll")))
    print("\n".join(report.transport_section(transports)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
