"""The Redis client the limiter uses, built once from settings (REDIS_URL or a django-redis alias)."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from .conf import on_reload, ratelimit_settings
from .engine import RedisClient

_lock = threading.Lock()
_client: RedisClient | None = None

CLUSTER_SCHEME = "redis+cluster"
SENTINEL_SCHEME = "redis+sentinel"


def _no_retry() -> Retry:
    # A retried EVALSHA may be charged twice; failures go to the fail mode instead.
    return Retry(NoBackoff(), 0)


def client_options() -> dict[str, Any]:
    """Connection options shared by every client the limiter builds: explicit timeouts, no retries."""
    return {
        "socket_connect_timeout": ratelimit_settings.SOCKET_CONNECT_TIMEOUT,
        "socket_timeout": ratelimit_settings.SOCKET_TIMEOUT,
        "retry": _no_retry(),
    }


def build_client(url: str) -> RedisClient:
    """Build a client for `url` with the limiter's timeouts (see docs/settings.md for the schemes)."""
    parts = urlsplit(url)
    if parts.scheme == CLUSTER_SCHEME or (ratelimit_settings.CLUSTER and parts.scheme in ("redis", "rediss")):
        plain = urlunsplit(parts._replace(scheme="redis")) if parts.scheme == CLUSTER_SCHEME else url
        return RedisCluster.from_url(plain, **client_options())
    if parts.scheme == SENTINEL_SCHEME:
        from .sentinel import sentinel_master

        return sentinel_master(url, client_options())
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ImproperlyConfigured(
            f"RATELIMIT['REDIS_URL'] has scheme {parts.scheme!r}; expected redis, rediss, unix, "
            f"{CLUSTER_SCHEME} or {SENTINEL_SCHEME}"
        )
    return redis.Redis.from_url(url, **client_options())


def _client_from_cache_alias(alias: str) -> RedisClient:
    from django.conf import settings

    if alias not in settings.CACHES:
        raise ImproperlyConfigured(
            f"RATELIMIT['REDIS_URL'] is not set and RATELIMIT['CACHE_ALIAS'] = {alias!r} is not in CACHES"
        )
    try:
        from django_redis import get_redis_connection

        return get_redis_connection(alias)
    except NotImplementedError as exc:
        raise ImproperlyConfigured(
            f"RATELIMIT['CACHE_ALIAS'] = {alias!r} is not a django-redis cache; set RATELIMIT['REDIS_URL'] "
            "or point CACHE_ALIAS at a django_redis.cache.RedisCache"
        ) from exc


def get_redis() -> RedisClient:
    """The process-wide Redis client for rate limiting (created on first use, thread-safe)."""
    global _client
    client = _client
    if client is None:
        with _lock:
            if _client is None:
                url = ratelimit_settings.REDIS_URL
                _client = build_client(url) if url else _client_from_cache_alias(ratelimit_settings.CACHE_ALIAS)
            client = _client
    return client


@on_reload
def reset_client() -> None:
    """Forget the client so the next use builds one from the current settings."""
    global _client
    with _lock:
        _client = None
