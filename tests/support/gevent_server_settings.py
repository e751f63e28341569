"""Demo settings for the gunicorn gevent test (tests/test_gevent_live.py): the limiter reaches Redis at
RATELIMIT_TEST_LIMITER_URL (the test's counting proxy, with the pool's `max_connections` in the URL),
the lookup cache goes straight to REDIS_URL, and RATELIMIT['CONNECTIONS'] comes from
RATELIMIT_TEST_CONNECTIONS. The closed fail mode with generous timeouts: a request the limiter could
not decide answers 503, so the test sees it instead of an admission."""

from __future__ import annotations

import os

from project import settings as demo

globals().update({name: value for name, value in vars(demo).items() if name.isupper()})

PREFIX = os.environ["RATELIMIT_TEST_PREFIX"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["RATELIMIT_TEST_DB"]}}
CACHES = {"default": {**demo.CACHES["default"], "KEY_PREFIX": PREFIX}}
RATELIMIT: dict[str, object] = {
    **demo.RATELIMIT,
    "REDIS_URL": os.environ["RATELIMIT_TEST_LIMITER_URL"],
    "CONNECTIONS": os.environ.get("RATELIMIT_TEST_CONNECTIONS", "auto"),
    "KEY_PREFIX": PREFIX,
    "IP_RATE": "100000/m",
    "FAIL_MODE": "closed",
    "BUDGET_MS": 10000,
    "SOCKET_CONNECT_TIMEOUT": 5.0,
    "SOCKET_TIMEOUT": 10.0,
}
