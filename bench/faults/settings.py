"""Django settings of the demo as the fault harness runs it (DJANGO_SETTINGS_MODULE=bench.faults.settings).

The demo's settings, with the library's defaults for everything that decides what a fault does (budget,
socket timeouts, breaker, metrics flush interval), and from the environment: the store (REDIS_URL), the
key prefix, the fail mode, the number of app processes the local fail mode divides each limit by, the
harness's SQLite database and the ledger (a Redis of the harness, never faulted, where the protected view
counts what it served). No per-IP limit (every client is 127.0.0.1) and an in-process lookup cache, so
what is measured is the limiter's store alone.
"""

from __future__ import annotations

import os

from project import settings as demo

globals().update({name: value for name, value in vars(demo).items() if name.isupper()})

ROOT_URLCONF = "bench.faults.app"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["FAULTS_DB"]}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
RATELIMIT: dict[str, object] = {
    "REDIS_URL": os.environ["REDIS_URL"],
    "KEY_PREFIX": os.environ["FAULTS_PREFIX"],
    "IP_RATE": None,
    "FAIL_MODE": os.environ["FAULTS_FAIL_MODE"],
    "APP_SERVERS": int(os.environ["FAULTS_APP_SERVERS"]),
    "METRICS_ALLOWED_IPS": ["127.0.0.1"],
    "GATEWAY_NETWORKS": ["127.0.0.1"],  # the demo routes the gateway endpoint; check refuses it unguarded
}
