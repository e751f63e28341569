"""Settings of the demo site. Database: DATABASE_URL, else SQLite. Redis: see devtools.embedded."""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

from devtools.embedded import resolve_redis_url

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "demo-only-insecure-secret-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "ratelimit_app",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After authentication (session users get their tier); limits RATELIMIT['PATH_PREFIXES'] (/api/).
    "ratelimit_app.middleware.RateLimitMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"  # Channels' setting: the WebSocket echo (/ws/echo/)

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}", conn_max_age=60, conn_health_checks=True
    )
}

REDIS_URL = resolve_redis_url()

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "demo",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
    }
}

RATELIMIT = {
    "REDIS_URL": REDIS_URL,
    # The demo's API is for its API keys only: a request with neither a key nor a signed-in user gets 401
    # (without this line it would be limited per client IP and served).
    "REQUIRE_API_KEY": True,
    "METRICS_ALLOWED_IPS": ["127.0.0.1", "::1"],  # GET /metrics for a Prometheus on this machine
    "GATEWAY_NETWORKS": ["127.0.0.1", "::1"],  # the gateway endpoint for an nginx or Caddy on this machine
}

REST_FRAMEWORK: dict[str, object] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    # Read at request time by ratelimit_app.throttling (the demo's /drf/items/ uses the "items" scope).
    "DEFAULT_THROTTLE_RATES": {"anon": "100/m", "user": "1000/h", "items": "30/m"},
    # No proxy in front of the demo: clients are told apart by REMOTE_ADDR (see docs/security.md).
    "NUM_PROXIES": 0,
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"ratelimit_app": {"handlers": ["console"], "level": os.environ.get("RATELIMIT_LOG_LEVEL", "INFO")}},
}
