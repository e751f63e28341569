"""Process entry points for the cross-process concurrency test (importable by spawned children)."""

from __future__ import annotations

import threading
from typing import Any

import redis

from ratelimit_app import Policy, RateLimiter


def hammer(url: str, prefix: str, identity: str, policies: list[Policy], threads: int, hits: int,
           start: Any, results: Any, connections: str = "auto") -> None:
    """Hit `identity` from `threads` threads, `hits` times each, once `start` is set; put admitted in `results`."""
    client: redis.Redis = redis.Redis.from_url(url, socket_timeout=30, max_connections=threads + 2)
    limiter = RateLimiter(client, prefix=prefix, connections=connections)
    admitted = [0] * threads
    start.wait()

    def run(slot: int) -> None:
        for _ in range(hits):
            if limiter.hit(identity, policies).allowed:
                admitted[slot] += 1

    workers = [threading.Thread(target=run, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    client.close()
    results.put(sum(admitted))
