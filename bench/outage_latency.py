"""Limiter time per decision while Redis is stopped, black-holed, paused or loses replies (docs/operations.md).

Starts its own redis-server and a TCP proxy (tests/support/tcp_proxy.py) in front of it; the limiter runs with
production settings (BUDGET_MS 50, socket timeouts 50 ms) except where a row says otherwise. Each row:
300 decisions of one client during the outage, timed with time.perf_counter around
`LimiterService.hit`. "breaker" rows use BREAKER_FAILURES = 3 (the default); "every call" rows set it
to 1,000,000 so that every decision waits on Redis: the budget alone bounds them.

    .venv/bin/python bench/outage_latency.py            # prints a Markdown table
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.configure(INSTALLED_APPS=[], RATELIMIT={"METRICS_ENABLED": False})
django.setup()

import redis  # noqa: E402

from devtools.embedded import start_redis  # noqa: E402
from ratelimit_app import Policy, RateLimiter  # noqa: E402
from ratelimit_app.conf.settings import ratelimit_settings  # noqa: E402
from ratelimit_app.core.scripts import decide_source  # noqa: E402
from ratelimit_app.service.connection import build_client  # noqa: E402
from ratelimit_app.service.limiter import LimiterService  # noqa: E402
from tests.support.tcp_proxy import TcpProxy  # noqa: E402

DECISIONS = 300
POLICIES = [Policy("day", "sliding_window", limit=1_000_000, period=86400)]


def service_for(url: str, failures: int, socket_timeout: float) -> LimiterService:
    settings.RATELIMIT = {"METRICS_ENABLED": False, "BUDGET_MS": 50, "SOCKET_TIMEOUT": socket_timeout,
                          "SOCKET_CONNECT_TIMEOUT": socket_timeout, "FAIL_MODE": "closed",
                          "BREAKER_FAILURES": failures, "BREAKER_COOLDOWN": 1.0}
    ratelimit_settings.reload()
    return LimiterService(RateLimiter(build_client(url), prefix="bench"))


def run(outage: str, failures: int, socket_timeout: float) -> list[float]:
    server = start_redis()
    proxy = TcpProxy("127.0.0.1", server.port)
    admin = redis.Redis(port=server.port, socket_timeout=10)
    admin.script_load(decide_source())
    try:
        service = service_for(proxy.url, failures, socket_timeout)
        for _ in range(20):
            if service.hit("bench", POLICIES).degraded:
                raise RuntimeError("Redis did not answer before the outage")
        start: dict[str, Callable[[], Any]] = {
            "stopped": server.stop,
            "black hole": lambda: setattr(proxy, "mode", "black_hole"),
            # long enough for every decision of the row (CLIENT UNPAUSE would itself wait for the pause)
            "paused": lambda: admin.execute_command("CLIENT PAUSE", DECISIONS * 70 + 1000, "ALL"),
            "lost replies": lambda: setattr(proxy, "mode", "drop_replies"),
        }
        start[outage]()
        durations = []
        for _ in range(DECISIONS):
            began = time.perf_counter()
            decision = service.hit("bench", POLICIES)
            durations.append(time.perf_counter() - began)
            if not decision.degraded:
                raise RuntimeError(f"{outage}: a decision was made by Redis during the outage")
        return durations
    finally:
        admin.close()
        proxy.close()
        server.stop()


def main() -> None:
    print(f"{DECISIONS} decisions per row, BUDGET_MS = 50, FAIL_MODE closed\n")
    print("| outage | socket timeouts | breaker | p50 (ms) | p99 (ms) | max (ms) |")
    print("|---|---|---|---|---|---|")
    for outage in ("stopped", "black hole", "paused", "lost replies"):
        for failures, label in ((3, "breaker"), (1_000_000, "every call")):
            for socket_timeout in (0.05, 5.0):
                durations = sorted(run(outage, failures, socket_timeout))
                p99 = statistics.quantiles(durations, n=100)[98]
                print(f"| {outage} | {socket_timeout * 1000:.0f} ms | {label} | "
                      f"{statistics.median(durations) * 1000:.2f} | {p99 * 1000:.1f} | {durations[-1] * 1000:.1f} |")


if __name__ == "__main__":
    main()
