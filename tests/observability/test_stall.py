"""Decision metrics through a stalled Redis: a batch that timed out is sent again, yet applied once.

A Redis stopped with SIGSTOP (as a long fork, a VM pause or a network stall would) still accepts
connections and queues what is written to them; when it resumes it runs every queued copy of a batch
the flusher sent, timed out on and sent again. Stored counts must still equal what clients saw.

The pause here is 3 s at a 0.1 s flush interval and a 0.2 s socket timeout: several copies of a
batch queue up (about ten on an idle machine, fewer on a loaded one), as a dozen or more do for a
15 s pause at the default 1 s interval (run that with RATELIMIT_TEST_PAUSE=15
RATELIMIT_TEST_FLUSH_INTERVAL=1). The test starts its own redis-server (the
`server` fixture) to stop it.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

import pytest
import redis

from devtools.embedded import RedisProcess
from ratelimit_app.observability.queries import recent_metrics
from ratelimit_app.observability.recorder import flush
from tests.support.limits_support import make_key, make_tier

PAUSE = float(os.environ.get("RATELIMIT_TEST_PAUSE", "3"))
FLUSH_INTERVAL = float(os.environ.get("RATELIMIT_TEST_FLUSH_INTERVAL", "0.1"))
# what a client saw -> the outcome the metrics store for it
OUTCOME_OF_STATUS = {200: "allowed", 429: "blocked", 503: "blocked", 401: "unauthorized"}


def served_until(client: Any, keys: list[str], deadline: float, statuses: Counter[int]) -> None:
    """Requests until `deadline`, with each of `keys` in turn."""
    n = 0
    while time.monotonic() < deadline:
        statuses[client.get("/api/users", HTTP_X_API_KEY=keys[n % len(keys)]).status_code] += 1
        n += 1


def quiet(admin: redis.Redis, timeout: float = 10.0) -> None:
    """Wait until Redis runs nothing but these checks (every queued copy has run): three checks in a row
    that each see exactly one more command (their own) than the one before."""
    deadline = time.monotonic() + timeout
    calm, last = 0, int(admin.info("stats")["total_commands_processed"])
    while calm < 3:
        assert time.monotonic() < deadline, "Redis kept running commands after the load stopped"
        time.sleep(0.05)
        now = int(admin.info("stats")["total_commands_processed"])
        calm = calm + 1 if now == last + 1 else 0
        last = now


@pytest.mark.django_db
def test_counts_equal_what_clients_saw_through_a_redis_pause(client: Any, settings: Any,
                                                              server: RedisProcess) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url, "METRICS_FLUSH_INTERVAL": FLUSH_INTERVAL,
                          "SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2, "BUDGET_MS": 300,
                          "IP_RATE": "1000000/h", "BREAKER_COOLDOWN": 0.5}
    roomy = make_key(make_tier("roomy", [("burst", "token_bucket", 1, 3600, 1_000_000, "")]))
    tight = make_key(make_tier("tight", [("burst", "token_bucket", 1, 3600, 20, "")]))
    # allowed (during the pause too: the fail mode is open), 429 after 20, and 401 (no such key)
    keys = [roomy, roomy, tight, "nosuchprefix.secret"]
    admin = redis.Redis.from_url(server.url, socket_timeout=10)
    statuses: Counter[int] = Counter()
    errors_before = _flush_errors()

    served_until(client, keys, time.monotonic() + 1.0, statuses)
    server.process.send_signal(signal.SIGSTOP)
    try:
        served_until(client, keys, time.monotonic() + PAUSE, statuses)
    finally:
        server.process.send_signal(signal.SIGCONT)
    served_until(client, keys, time.monotonic() + 1.0, statuses)

    # two timeouts already mean three copies of one batch in the paused Redis's queue
    assert _flush_errors() >= errors_before + 2, "the flusher did not time out and retry through the pause"
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_FLUSH_INTERVAL": 3600.0}
    deadline = time.monotonic() + 10
    while not flush():
        assert time.monotonic() < deadline, "the counts did not reach Redis after it resumed"
    quiet(admin)
    seen: Counter[str] = Counter()
    for status, count in statuses.items():
        seen[OUTCOME_OF_STATUS[status]] += count
    assert set(statuses) >= {200, 401, 429}, statuses  # the load had all three outcomes
    stored = recent_metrics(hours=2)
    assert (stored.allowed, stored.blocked, stored.unauthorized) == \
        (seen["allowed"], seen["blocked"], seen["unauthorized"]), statuses
    for name in admin.scan_iter(match=f"{settings.RATELIMIT['KEY_PREFIX']}:*"):
        assert admin.ttl(name) > 0, name  # every key the load wrote expires


def _flush_errors() -> int:
    from ratelimit_app.observability.snapshot import process_metrics

    return process_metrics().flush_errors
