"""Redis memory per identity for each algorithm, measured with MEMORY USAGE (the numbers in docs/operations.md).

Starts its own redis-server (devtools.embedded), so nothing else shares the measurement. For each
algorithm and fill level it charges 1,000 identities with one policy named "minute" under the default
key prefix "rl" (the identity's key, `rl:{<24 hex>}`, holding the policy's entry; a long sliding log,
limit 128 or more, also has a key of its own, `rl:{<24 hex>}sminute`), then reports the mean over the
identities of `MEMORY USAGE <key> SAMPLES 0` summed over the identity's keys (each key's own
allocation, key name included) and the growth of INFO used_memory per identity (what the server really
allocated, its dictionary overhead included). A last row fills a long log one request at a time, as
traffic does (20 identities: 40,000 hits), where the rows above charge all their units in one hit: Redis
grows a string that is appended to ahead of its length, so the same units take more room.

    .venv/bin/python bench/memory_per_key.py            # prints a Markdown table
"""

from __future__ import annotations

import sys
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.embedded import start_redis
from ratelimit_app import Policy, RateLimiter
from ratelimit_app.core.engine import prepare_call

IDENTITIES = 1000
#: identities of the cases filled one request at a time (every identity's keys are alike: few suffice)
IDENTITIES_ONE_AT_A_TIME = 20

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
    ("sliding_window", 100, 1, "1 unit"),
    ("sliding_window", 100, 10, "10 units"),
    ("sliding_window", 100, 100, "100 units"),
    ("sliding_window", 2000, 1, "1 unit"),
    ("sliding_window", 2000, 10, "10 units"),
    ("sliding_window", 2000, 100, "100 units"),
    ("sliding_window", 2000, 1000, "1,000 units"),
    ("sliding_window", 2000, 2000, "2,000 units"),
]
#: the same, filled one request (one unit) at a time
ONE_AT_A_TIME: list[tuple[str, int, int, str]] = [
    ("sliding_window", 2000, 2000, "2,000 units, one request at a time"),
]


def measure(client: redis.Redis, algorithm: str, limit: int, units: int,
            one_at_a_time: bool = False) -> tuple[float, float]:
    """(mean MEMORY USAGE of an identity's keys, used_memory growth per identity) for one case, in bytes:
    `units` charged in one hit, or in `units` hits of one unit."""
    client.flushall()
    limiter = RateLimiter(client, prefix="rl")
    # a day: no state expires or refills while the 1,000 identities are measured
    policies = [Policy("minute", algorithm, limit=limit, period=86400)]
    limiter.hit("warm-up", policies)  # loads the script before the baseline
    client.delete(*identity_keys(limiter, "warm-up", policies))
    before = int(client.info("memory")["used_memory"])
    keys = []
    identities = IDENTITIES_ONE_AT_A_TIME if one_at_a_time else IDENTITIES
    for n in range(identities):
        identity = f"apikey:{n}"
        for cost in [1] * units if one_at_a_time else [units]:
            decision = limiter.hit(identity, policies, cost=cost)
            if not decision.allowed:
                raise RuntimeError(f"{algorithm}: charging {cost} of {units} units was denied: {decision}")
        keys.append(identity_keys(limiter, identity, policies))
    after = int(client.info("memory")["used_memory"])
    usage = [[int(client.memory_usage(key, samples=0) or 0) for key in names] for names in keys]
    if any(0 in sizes for sizes in usage):
        raise RuntimeError(f"{algorithm}: expected every key of the {identities} identities to be live")
    return sum(map(sum, usage)) / identities, (after - before) / identities


def identity_keys(limiter: RateLimiter, identity: str, policies: list[Policy]) -> list[str]:
    """Every key that holds state of `identity`: its own key, and a long log's key when it has one."""
    names = prepare_call(limiter.prefix, ((identity, policies),), 1, charge=False).keys[:1]
    return names + [key for key in limiter.keys(identity, policies) if key not in names]


def main() -> None:
    server = start_redis()
    try:
        client = redis.Redis(port=server.port, socket_timeout=30)
        version = client.info("server")["redis_version"]
        print(f"Redis {version}, {IDENTITIES} identities per case ({IDENTITIES_ONE_AT_A_TIME} filled one request "
              "at a time), one policy per identity\n")
        print("| algorithm | limit | state after the hit(s) | MEMORY USAGE per identity (bytes, its keys) "
              "| used_memory per identity (bytes) |")
        print("|---|---:|---|---|---|")
        for cases, one_at_a_time in ((CASES, False), (ONE_AT_A_TIME, True)):
            for algorithm, limit, units, label in cases:
                per_key, per_identity = measure(client, algorithm, limit, units, one_at_a_time)
                print(f"| `{algorithm}` | {limit:,} | {label} | {per_key:.0f} | {per_identity:.0f} |")
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
