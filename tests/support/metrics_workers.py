"""A separate Python process that records decisions and exits, for the fork and atexit tests.

Run as `python -m tests.support.metrics_workers PREFIX PARENT_COUNT CHILD_COUNT` with REDIS_URL set: records
PARENT_COUNT allowed decisions, forks, the child records CHILD_COUNT blocked ones and exits with
sys.exit (atexit runs, as in a gunicorn worker); the parent waits and exits normally. The flush
interval is an hour, so only the exit flushes can bring the counts to Redis. CHILD_COUNT 0: no fork.
"""

from __future__ import annotations

import os
import sys

import django


def main(prefix: str, parent_count: int, child_count: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from django.conf import settings

    settings.RATELIMIT = {**settings.RATELIMIT, "KEY_PREFIX": prefix, "METRICS_FLUSH_INTERVAL": 3600,
                          "SOCKET_TIMEOUT": 5.0, "SOCKET_CONNECT_TIMEOUT": 2.0}
    from ratelimit_app.observability.recorder import record_decision

    for _ in range(parent_count):
        record_decision(allowed=True, tier="free", policy=None, degraded=False, identity="ip:192.0.2.1")
    if not child_count:
        return
    pid = os.fork()
    if pid == 0:
        for _ in range(child_count):
            record_decision(allowed=False, tier="free", policy="minute", degraded=False, identity="key:child")
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child exited with {status}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
