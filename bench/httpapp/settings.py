"""Django settings of the benchmark: every worker process and the gunicorn app under test use them.

The Redis is the benchmark's own (BENCH_REDIS_URL, started by bench/run.py); the database is the
SQLite file BENCH_DB_PATH (a temporary file, migrated by bench/http_bench.py). BENCH_HTTP_VARIANT
selects what the HTTP view goes through (see bench/httpapp/variants.py); the engine measurements
ignore it.
"""

from __future__ import annotations

import os
import tempfile

from bench.httpapp.variants import configure

REDIS_URL = os.environ["BENCH_REDIS_URL"]
VARIANT = os.environ.get("BENCH_HTTP_VARIANT", "none")

SECRET_KEY = "bench-only-insecure-secret-key"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "bench.httpapp.urls"
WSGI_APPLICATION = "bench.httpapp.wsgi.application"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rest_framework",
    "ratelimit_app",
]
MIDDLEWARE: list[str] = []

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("BENCH_DB_PATH", os.path.join(tempfile.gettempdir(), "ratelimit-bench.sqlite3")),
    }
}

# One django-redis cache on the benchmark's Redis: DRF's throttles and django-ratelimit store here.
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "bench",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 5, "SOCKET_TIMEOUT": 10},
    }
}

# ratelimit_app: generous timeouts so a loaded 2-core machine measures speed, not the fail mode.
RATELIMIT: dict[str, object] = {
    "REDIS_URL": REDIS_URL,
    "SOCKET_CONNECT_TIMEOUT": 5.0,
    "SOCKET_TIMEOUT": 10.0,
    "BUDGET_MS": 10_000,
    "METRICS_ENABLED": True,
    # the gateway benchmark runs docs/gateway.md's nginx block as written: it sends this placeholder secret
    "GATEWAY_SECRET": "replace-with-your-RATELIMIT-GATEWAY_SECRET",
}

# django-ratelimit
RATELIMIT_USE_CACHE = "default"
# django-smart-ratelimit: its Redis backend on the same server.
RATELIMIT_BACKEND = "redis"
RATELIMIT_REDIS = {"url": REDIS_URL}

REST_FRAMEWORK: dict[str, object] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "root": {"handlers": ["null"], "level": "WARNING"},
}

configure(globals(), VARIANT)
