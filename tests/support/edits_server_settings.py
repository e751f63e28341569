"""Demo settings for the app servers of tests/plans/test_edits.py: Django's default cache (LocMemCache,
one per process, as `startproject` leaves it), the test's SQLite file, Redis and key prefix, lookups cached
for five minutes unless the test says otherwise (so only the announcement of an edit can make a server
apply it within seconds), and a per-IP limit the test never reaches."""

from __future__ import annotations

import os

from project import settings as demo

globals().update({name: value for name, value in vars(demo).items() if name.isupper()})

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["RATELIMIT_TEST_DB"]}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
RATELIMIT: dict[str, object] = {
    **demo.RATELIMIT,
    "KEY_PREFIX": os.environ["RATELIMIT_TEST_PREFIX"],
    "CACHE_TTL": float(os.environ.get("RATELIMIT_TEST_CACHE_TTL", "300")),
    "IP_RATE": "100000/m",
    "BUDGET_MS": 2000,
    "SOCKET_CONNECT_TIMEOUT": 1.0,
    "SOCKET_TIMEOUT": 2.0,
}
