"""Settings of the sample shop: what `django-admin startproject` writes, plus ratelimit_app.

Redis: REDIS_URL, else the one this repository's scripts use (127.0.0.1:6379 when it answers, else a
redis-server of the run's own: devtools.embedded). RATELIMIT_BACKEND=memory decides in process instead,
with no Redis at all. Database: DATABASE_URL, else SQLite. The Django cache is the default local-memory one.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

from devtools.embedded import resolve_redis_url

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "sample-shop-for-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "rest_framework",
    "ratelimit_app",
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "ratelimit_app.middleware.RateLimitMiddleware",
]
ROOT_URLCONF = "shop.urls"

DATABASES = {"default": dj_database_url.config(default=f"sqlite:///{BASE_DIR / 'shop.sqlite3'}")}
if "sqlite" not in DATABASES["default"]["ENGINE"]:  # a test database of its own beside the repository's suite's
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_shop"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True

RATELIMIT = {
    "REDIS_URL": resolve_redis_url(),
    "BACKEND": os.environ.get("RATELIMIT_BACKEND", "redis"),
}
REST_FRAMEWORK: dict[str, object] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_THROTTLE_RATES": {"search": "5/m"},
    "NUM_PROXIES": 0,
}
