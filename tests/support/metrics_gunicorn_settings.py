"""Demo settings for the gunicorn metrics test: the test's key prefix, a small exact per-IP limit, and a flush
interval of an hour, so only the workers' exit flushes can bring the counts to Redis."""

from __future__ import annotations

import os

from project import settings as demo

globals().update({name: value for name, value in vars(demo).items() if name.isupper()})

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["RATELIMIT_TEST_DB"]}}

RATELIMIT: dict[str, object] = {
    **demo.RATELIMIT,
    "KEY_PREFIX": os.environ["RATELIMIT_TEST_PREFIX"],
    "IP_RATE": "40/h",  # an hour: the test's 60 requests never straddle a window that lets more through
    "IP_ALGORITHM": "sliding_window",  # exact: the test counts exactly
    "METRICS_FLUSH_INTERVAL": 3600.0,
}
