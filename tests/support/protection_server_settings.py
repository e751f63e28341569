"""Demo settings for the live-server tests of concurrency slots and load shedding (gunicorn, uvicorn):
the test's key prefix (Redis keys and the shared lookup cache), a per-IP limit the tests never reach,
the fleet shedder's capacity (and the process shedder's limit, when the test gives one), and generous
Redis timeouts with the closed fail mode, so a slow Redis on a loaded machine refuses (503) instead of
admitting a request without its slot (a test of outages gives its own fail mode and budget)."""

from __future__ import annotations

import os

from project import settings as demo

globals().update({name: value for name, value in vars(demo).items() if name.isupper()})

PREFIX = os.environ["RATELIMIT_TEST_PREFIX"]
CACHES = {"default": {**demo.CACHES["default"], "KEY_PREFIX": PREFIX}}
RATELIMIT: dict[str, object] = {
    **demo.RATELIMIT,
    "KEY_PREFIX": PREFIX,
    "IP_RATE": "100000/m",
    "SHED_CAPACITY": int(os.environ.get("RATELIMIT_TEST_SHED_CAPACITY", "10")),
    "SHED_PROCESS_LIMIT": int(os.environ["RATELIMIT_TEST_SHED_PROCESS_LIMIT"])
    if os.environ.get("RATELIMIT_TEST_SHED_PROCESS_LIMIT") else None,
    "FAIL_MODE": os.environ.get("RATELIMIT_TEST_FAIL_MODE", "closed"),
    "BUDGET_MS": int(os.environ.get("RATELIMIT_TEST_BUDGET_MS", "5000")),
    "SOCKET_CONNECT_TIMEOUT": 2.0,
    "SOCKET_TIMEOUT": 5.0,
}
