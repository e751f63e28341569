"""What usage limits cost: Redis time of the decision script on a route without usage limits, before the
per-policy cost was added (main's decide.lua) and now, and the round trips of a request that reserves.

    python bench/usage_bench.py redis://127.0.0.1:6399/0 [--calls 20000] [--rounds 5]

Uses a Redis of its own (it runs CONFIG RESETSTAT between rounds): never a shared one.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import redis

from ratelimit_app import Policy, RateLimiter
from ratelimit_app.core.engine import prepare_call
from ratelimit_app.core.scripts import decide_source, read_lua

TIER = (Policy("burst", "token_bucket", limit=20, period=60, burst=10),
        Policy("minute", "sliding_window", limit=20, period=60),
        Policy("day", "fixed_window", limit=1000, period=86400))
IP = (Policy("ip", "sliding_window_counter", limit=100, period=60),)


def usec_per_call(client: redis.Redis, sha: str, calls: int, offset: int) -> float:
    """Redis's own time per EVALSHA of `sha` over `calls` allowed decisions of new identities (peeks)."""
    client.config_resetstat()
    for i in range(calls):
        call = prepare_call("bench", ((f"ip:{offset + i}", IP), (f"key:{offset + i}", TIER)), 1,
                            charge=False)
        client.execute_command("EVALSHA", sha, call.plan.key_count, *call.keys, *call.args)
    stats = client.info("commandstats")["cmdstat_evalsha"]
    return float(stats["usec"]) / float(stats["calls"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    client = redis.Redis.from_url(options.url)
    before = subprocess.run(["git", "show", "main:ratelimit_app/core/lua/decide.lua"], check=True,
                            capture_output=True, text=True).stdout
    scripts = {"main": decide_source().replace(read_lua("decide.lua"), before), "now": decide_source()}
    shas = {name: client.script_load(source) for name, source in scripts.items()}
    times: dict[str, list[float]] = {name: [] for name in scripts}
    for round_ in range(options.rounds):
        for name, sha in shas.items():
            times[name].append(usec_per_call(client, sha, options.calls, (round_ * 2 + len(times[name])) * 10**7))
    for name, values in times.items():
        print(f"decide.lua ({name}), a route without usage limits: {statistics.median(values):.2f} us per call "
              f"(rounds {', '.join(f'{v:.2f}' for v in values)})")

    limiter = RateLimiter(client, prefix="bench-usage")
    route = (Policy("minute", "sliding_window", limit=10**6, period=60),
             Policy("day", "fixed_window", limit=10**6, period=86400))
    for algorithm in ("sliding_window", "gcra"):
        tokens = Policy("tokens", algorithm, limit=40_000, period=60, unit="tokens")  # 40,000 tokens a minute
        identity = f"key:usage-{algorithm}"
        limiter.reset(identity, [*route, tokens])
        client.config_resetstat()
        started = time.perf_counter()
        for _ in range(1000):
            decision, reservation = limiter.reserve(identity, [*route, tokens], {"tokens": 500})
            assert decision.allowed and limiter.settle(reservation, {"tokens": 10}) == 1
        elapsed = time.perf_counter() - started
        stats = client.info("commandstats")["cmdstat_evalsha"]
        print(f"reserve 500 + settle 10 against {algorithm} 40,000/m (1,000 requests, 10,000 used): "
              f"{stats['calls'] / 1000:.2f} EVALSHA per request, {stats['usec'] / 1000:.1f} us of Redis and "
              f"{elapsed:.3f} ms of the client per request")
    client.config_resetstat()
    started = time.perf_counter()
    for _ in range(1000):
        limiter.hit("key:plain", route)
    stats = client.info("commandstats")["cmdstat_evalsha"]
    print(f"hit of the same route without the usage limit: {stats['calls'] / 1000:.2f} EVALSHA per request, "
          f"{stats['usec'] / 1000:.1f} us of Redis and {time.perf_counter() - started:.3f} ms of the client")


if __name__ == "__main__":
    main()
