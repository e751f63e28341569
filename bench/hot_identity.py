"""Redis time per decision on one hot identity, as its state grows: `usec_per_call` of EVALSHA.

    python bench/hot_identity.py [--sizes 100 1000 5000 20000] [--calls 300]

One identity is hit again and again under limits no run reaches (as the HTTP sections' bench tier is):
an algorithm whose state is O(1) costs the same at every size, and so should the exact sliding window,
which keeps one entry per admitted unit in its window (7 bytes each): a log whose limit is 128 or more
has a key of its own, which a hit appends to (lua/sliding_window.lua); a short log, in its identity's
entry, is copied whole by every admitted hit. For each algorithm, and the 3-policy tier, the
identity is filled to each size, statistics are reset, and `--calls` more hits are measured. Starts
its own redis-server on a free loopback port, like bench/redis_time.py; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.embedded import start_redis
from ratelimit_app import Policy, RateLimiter

#: Limits no run reaches: nothing is denied, so every hit is admitted and written.
HUGE = 1_000_000
CASES: dict[str, list[Policy]] = {
    "sliding_window (exact log)": [Policy("minute", "sliding_window", limit=HUGE, period=60)],
    "sliding_window_counter": [Policy("minute", "sliding_window_counter", limit=HUGE, period=60)],
    "token_bucket": [Policy("burst", "token_bucket", limit=HUGE, period=60, burst=HUGE)],
    "fixed_window": [Policy("day", "fixed_window", limit=HUGE, period=86_400)],
    "tier: token_bucket + sliding_window + fixed_window": [
        Policy("burst", "token_bucket", limit=HUGE, period=60, burst=HUGE),
        Policy("minute", "sliding_window", limit=HUGE, period=60),
        Policy("day", "fixed_window", limit=100 * HUGE, period=86_400),
    ],
}


def measure(client: redis.Redis, policies: list[Policy], sizes: list[int], calls: int) -> list[float]:
    """usec_per_call of `calls` hits on one identity once it holds each of `sizes` admitted units."""
    client.flushall()
    limiter = RateLimiter(client, prefix="hot")
    done = 0
    usec = []
    for size in sizes:
        while done < size:
            limiter.hit("hot", policies)
            done += 1
        client.config_resetstat()
        for _ in range(calls):
            limiter.hit("hot", policies)
        done += calls
        usec.append(float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]))
    client.flushall()
    return usec


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/hot_identity.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000, 20000],
                        help="admitted units the identity holds before each measurement")
    parser.add_argument("--calls", type=int, default=300, help="hits measured at each size")
    args = parser.parse_args(argv)
    server = start_redis()
    try:
        client = redis.Redis.from_url(server.url, socket_timeout=60)
        print(f"| policies (huge limits, one identity) | {' | '.join(f'{n:,} units' for n in args.sizes)} |")
        print("| :--- |" + " ---: |" * len(args.sizes))
        for name, policies in CASES.items():
            usec = measure(client, policies, args.sizes, args.calls)
            print(f"| {name} | {' | '.join(f'{u:.1f}' for u in usec)} |")
        print(f"\nusec_per_call of EVALSHA (INFO commandstats) over {args.calls} hits at each size.")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
