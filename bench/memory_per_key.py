"""Redis memory per key for each algorithm, measured with MEMORY USAGE (the numbers in docs/operations.md).

Starts its own redis-server (devtools.embedded), so nothing else shares the measurement. For each
algorithm and fill level it charges 1,000 identities with one policy named "minute" under the default
key prefix "rl" (the identity's key, `rl:{<24 hex>}`, holding the policy's entry), then reports the mean of
`MEMORY USAGE <key> SAMPLES 0` (the key's own allocation, key name included) and the growth of
INFO used_memory per identity (what the server really allocated, its dictionary overhead included).

    .venv/bin/python bench/memory_per_key.py            # prints a Markdown table
"""

from __future__ import annotations

import sys
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.embedded import start_redis
from ratelimit_app import Policy, RateLimiter

IDENTITIES = 1000

# (algorithm, limit, units charged per identity, what the state then holds)
CASES: list[tuple[str, int, int, str]] = [
    ("fixed_window", 1000, 1, "1 unit"),
    ("fixed_window", 1000, 1000, "1,000 units"),
    ("sliding_window_counter", 1000, 1, "1 unit"),
    ("sliding_window_counter", 1000, 1000, "1,000 units"),
    ("token_bucket", 1000, 1, "1 unit"),
    ("token_bucket", 1000, 1000, "empty bucket"),
    ("gcra", 1000, 1, "1 unit"),
    ("gcra", 1000, 1000, "1,000 units"),
    ("sliding_window", 2000, 1, "1 unit"),
    ("sliding_window", 2000, 10, "10 units"),
    ("sliding_window", 2000, 100, "100 units"),
    ("sliding_window", 2000, 1000, "1,000 units"),
    ("sliding_window", 2000, 2000, "2,000 units"),
]


def measure(client: redis.Redis, algorithm: str, limit: int, units: int) -> tuple[float, float]:
    """(mean MEMORY USAGE per key, used_memory growth per identity) for one case, in bytes."""
    client.flushall()
    limiter = RateLimiter(client, prefix="rl")
    # a day: no state expires or refills while the 1,000 identities are measured
    policies = [Policy("minute", algorithm, limit=limit, period=86400)]
    limiter.hit("warm-up", policies)  # loads the script before the baseline
    client.delete(*limiter.keys("warm-up", policies))
    before = int(client.info("memory")["used_memory"])
    keys = []
    for n in range(IDENTITIES):
        identity = f"apikey:{n}"
        decision = limiter.hit(identity, policies, cost=units)
        if not decision.allowed:
            raise RuntimeError(f"{algorithm}: charging {units} units was denied: {decision}")
        keys.extend(limiter.keys(identity, policies))
    after = int(client.info("memory")["used_memory"])
    usage = [int(client.memory_usage(key, samples=0) or 0) for key in keys]
    if len(usage) != IDENTITIES or 0 in usage:
        raise RuntimeError(f"{algorithm}: expected {IDENTITIES} live keys")
    return sum(usage) / len(usage), (after - before) / IDENTITIES


def main() -> None:
    server = start_redis()
    try:
        client = redis.Redis(port=server.port, socket_timeout=30)
        version = client.info("server")["redis_version"]
        print(f"Redis {version}, {IDENTITIES} identities per case, one policy per key\n")
        print("| algorithm | state after the hit(s) | MEMORY USAGE per key (bytes) "
              "| used_memory per identity (bytes) |")
        print("|---|---|---|---|")
        for algorithm, limit, units, label in CASES:
            per_key, per_identity = measure(client, algorithm, limit, units)
            print(f"| `{algorithm}` | {label} | {per_key:.0f} | {per_identity:.0f} |")
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
