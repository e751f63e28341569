"""What usage limits cost: Redis time of the decision script on a route without usage limits, before usage
limits existed and now, and the round trips of a request that reserves and settles.

    python3 bench/usage_bench.py [--calls 20000] [--rounds 5] [--write]

Starts a redis-server of its own (it runs CONFIG RESETSTAT between rounds). The script "before" is
decide.lua as it was in the commit before settle.lua was added (`git show`); "now" is the current one.
Each round times `--calls` allowed decisions (peeks) of new identities over a tier's three policies and
the per-IP one, with each script in turn (Redis's own time, INFO commandstats; each row is the median
round). Then 1,000 requests reserve 500 tokens and settle 10 against a 40,000/m token limit (sliding log
and GCRA), and 1,000 plain hits of the same route, counting EVALSHA calls. --write puts the results into
docs/benchmarks.md as a marked section, which `bench/run.py` keeps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from devtools.embedded import start_redis  # noqa: E402
from ratelimit_app import Policy, RateLimiter  # noqa: E402
from ratelimit_app.core.engine import prepare_call  # noqa: E402
from ratelimit_app.core.scripts import decide_source, read_lua  # noqa: E402

TIER = (Policy("burst", "token_bucket", limit=20, period=60, burst=10),
        Policy("minute", "sliding_window", limit=20, period=60),
        Policy("day", "fixed_window", limit=1000, period=86400))
IP = (Policy("ip", "sliding_window_counter", limit=100, period=60),)
REQUESTS = 1000


def usec_per_call(client: redis.Redis, sha: str, calls: int, offset: int) -> float:
    """Redis's own time per EVALSHA of `sha` over `calls` allowed decisions of new identities (peeks)."""
    client.config_resetstat()
    for i in range(calls):
        call = prepare_call("bench", ((f"ip:{offset + i}", IP), (f"key:{offset + i}", TIER)), 1,
                            charge=False)
        client.execute_command("EVALSHA", sha, call.plan.key_count, *call.keys, *call.args)
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / float(stats["calls"])


def decide_before_usage() -> tuple[str, str]:
    """decide.lua in the commit before settle.lua was added, and that commit's short hash."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()

    added = git("log", "--diff-filter=A", "--format=%H", "--", "ratelimit_app/core/lua/settle.lua").splitlines()[-1]
    before = git("rev-parse", "--short", f"{added}^")
    return git("show", f"{before}:ratelimit_app/core/lua/decide.lua") + "\n", before


def measure(client: redis.Redis, calls: int, rounds: int) -> list[str]:
    source, commit = decide_before_usage()
    scripts = {f"before usage limits ({commit})": decide_source().replace(read_lua("decide.lua"), source),
               "now": decide_source()}
    shas = {name: client.script_load(text) for name, text in scripts.items()}
    times: dict[str, list[float]] = {name: [] for name in scripts}
    for round_ in range(rounds):
        for index, (name, sha) in enumerate(shas.items()):
            times[name].append(usec_per_call(client, sha, calls, (round_ * len(shas) + index) * 10**7))
    lines = [f"{calls:,} peeks of new identities per round, {rounds} rounds (median round); {os.cpu_count()} cores",
             "", "| decide.lua, a route without usage limits | us of Redis per call (median) | rounds (us) |",
             "|---|---|---|"]
    for name, values in times.items():
        lines.append(f"| {name} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    lines += ["", "| 1,000 requests | EVALSHA per request | us of Redis per request | ms of the client per request |",
              "|---|---|---|---|"]
    limiter = RateLimiter(client, prefix="bench-usage")
    route = (Policy("minute", "sliding_window", limit=10**6, period=60),
             Policy("day", "fixed_window", limit=10**6, period=86400))
    for algorithm in ("sliding_window", "gcra"):
        tokens = Policy("tokens", algorithm, limit=40_000, period=60, unit="tokens")
        identity = f"key:usage-{algorithm}"
        limiter.reset(identity, [*route, tokens])
        client.config_resetstat()
        started = time.perf_counter()
        for _ in range(REQUESTS):
            decision, reservation = limiter.reserve(identity, [*route, tokens], {"tokens": 500})
            assert decision.allowed and limiter.settle(reservation, {"tokens": 10}) == 1
        lines.append(_row(f"reserve 500 tokens, settle 10 ({algorithm} 40,000/m, and the route's 2 limits)",
                          client, started))
    client.config_resetstat()
    started = time.perf_counter()
    for _ in range(REQUESTS):
        assert limiter.hit("key:plain", route).allowed
    lines.append(_row("a plain hit of the same route (no usage limit)", client, started))
    return lines


def _row(label: str, client: redis.Redis, started: float) -> str:
    elapsed = time.perf_counter() - started
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return (f"| {label} | {stats['calls'] / REQUESTS:.2f} | {stats['usec'] / REQUESTS:.1f} | "
            f"{elapsed * 1000 / REQUESTS:.3f} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="put the tables into docs/benchmarks.md")
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]
    server = start_redis()
    client = redis.Redis.from_url(server.url)
    try:
        lines = measure(client, args.calls, args.rounds)
    finally:
        client.close()
        server.stop()
    print("\n".join(lines))
    if args.write:
        from bench.report_text import write_script_section

        write_script_section("usage", "## 11. Usage limits: reserve and settle", "bench/usage_bench.py", [
            "A request that reserves usage (a token estimate) is decided in its one EVALSHA, as any request;",
            "settling what it used when it ends costs one more. A route without usage limits costs exactly",
            "what it cost before usage limits existed: one EVALSHA, and the decision script's Redis time",
            "(the script compares each policy's code once more). Against a redis-server of the benchmark's own.",
        ], lines, load_at_start, os.getloadavg()[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
