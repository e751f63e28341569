"""The Redis clients the limiter uses, built from settings (REDIS_URL or a django-redis alias): explicit
timeouts, no retries (a retried EVALSHA could charge twice), and connections that keep each call within the
time budget (ratelimit_app.core.redispy)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import redis
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import ConnectionPool
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from ..conf.redisurl import CLUSTER_SCHEME, SENTINEL_SCHEME
from ..conf.settings import SettingsCached, ratelimit_settings
from ..core.engine_async import AsyncRedisClient
from ..core.engine_sync import RedisClient, resolve_connections
from ..core.redispy import (
    HANDSHAKE,
    BudgetBlockingConnectionPool,
    BudgetConnection,
    BudgetSSLConnection,
    BudgetUnixConnection,
    async_connection_class,
    budget_class_for,
)
from .sentinel import async_sentinel_master, host_ports, sentinel_master

#: Connections of the limiter's pool on the "pool" path when REDIS_URL names no `max_connections`.
POOL_MAX_CONNECTIONS = 50


def _pool_path() -> bool:
    """True when the sync engine decides through the client's pool (see engine_sync)."""
    return resolve_connections(ratelimit_settings.CONNECTIONS) == "pool"


def _budget_seconds() -> float:
    """RATELIMIT['BUDGET_MS'] in seconds."""
    return float(ratelimit_settings.BUDGET_MS) / 1000.0


def socket_timeouts() -> tuple[float, float]:
    """(connect timeout, read timeout) in seconds: the settings, never longer than the budget."""
    budget = _budget_seconds()
    return (min(float(ratelimit_settings.SOCKET_CONNECT_TIMEOUT), budget),
            min(float(ratelimit_settings.SOCKET_TIMEOUT), budget))


def _client_options() -> dict[str, Any]:
    """Connection options shared by every client the limiter builds: explicit timeouts, no retries (a retried
    EVALSHA may be charged twice; failures go to the fail mode instead)."""
    connect_timeout, read_timeout = socket_timeouts()
    return {"socket_connect_timeout": connect_timeout, "socket_timeout": read_timeout,
            "retry": Retry(NoBackoff(), 0), **HANDSHAKE}


def _scheme_connection_class(scheme: str) -> type[Any]:
    return {"rediss": BudgetSSLConnection, "unix": BudgetUnixConnection}.get(scheme, BudgetConnection)


def _cluster_nodes(netloc: str) -> list[tuple[str, int]]:
    """(host, port) of every node in the network location of a cluster URL."""
    return host_ports(netloc, "cluster node", "redis+cluster://host:7000,host:7001")


def _cluster_client(url: str) -> RedisCluster:
    """A RedisCluster for "redis+cluster://[user:pass@]host:port[,host:port...]" or a plain redis:// URL."""
    parts = urlsplit(url)
    scheme = "redis" if parts.scheme == CLUSTER_SCHEME else parts.scheme
    options = _client_options()
    options["connection_class"] = _scheme_connection_class(scheme)
    # Each node gets its own pool of budget-respecting connections; the cluster client itself never
    # retries, so a decision whose reply was lost is never resent to another node.
    userinfo, at, hosts = parts.netloc.rpartition("@")
    nodes = [ClusterNode(host, port) for host, port in _cluster_nodes(parts.netloc)]
    # from_url (one node) builds every node's pool with our connection class; the other nodes of the
    # URL join as extra startup nodes, so the client starts while any one of them answers
    first = urlunsplit(parts._replace(scheme=scheme, netloc=f"{userinfo}{at}{hosts.split(',')[0]}"))
    try:
        return RedisCluster.from_url(first, startup_nodes=nodes[1:], **options)
    except RedisClusterException as exc:
        # RedisCluster contacts the cluster when built; keep that failure in the RedisError family
        # that every caller of a Redis client already handles.
        raise redis.ConnectionError(f"Redis Cluster at {hosts} cannot be reached: {exc}") from exc


def _is_cluster(scheme: str) -> bool:
    return scheme == CLUSTER_SCHEME or (ratelimit_settings.CLUSTER and scheme in ("redis", "rediss"))


def _check_scheme(scheme: str) -> None:
    """ImproperlyConfigured for a scheme no client is built for (cluster and sentinel URLs are handled first)."""
    if scheme not in ("redis", "rediss", "unix"):
        raise ImproperlyConfigured(f"RATELIMIT['REDIS_URL'] has scheme {scheme!r}; expected redis, rediss, unix, "
                                   f"{CLUSTER_SCHEME} or {SENTINEL_SCHEME}")


def build_client(url: str) -> RedisClient:
    """Build a client for `url` with the limiter's timeouts (see docs/settings.md for the schemes)."""
    parts = urlsplit(url)
    if _is_cluster(parts.scheme):
        return _cluster_client(url)
    if parts.scheme == SENTINEL_SCHEME:
        return sentinel_master(url, _client_options())
    _check_scheme(parts.scheme)
    connection_class = _scheme_connection_class(parts.scheme)
    if _pool_path():  # the URL's own max_connections, if any, wins over the default
        pool = BudgetBlockingConnectionPool.from_url(url, connection_class=connection_class,
                                                     max_connections=POOL_MAX_CONNECTIONS, timeout=_budget_seconds(),
                                                     **_client_options())
        return redis.Redis(connection_pool=pool)
    return redis.Redis.from_url(url, connection_class=connection_class, **_client_options())


_ALIAS_KEYS = frozenset({
    "host", "port", "path", "db", "username", "password", "credential_provider", "client_name",
    "socket_keepalive", "socket_keepalive_options", "encoding", "encoding_errors", "decode_responses",
})


def _where_and_who(pool: ConnectionPool) -> dict[str, Any]:
    """Where and who a cache's pool connects as; its other keys belong to its own protocol and handlers (RESP3
    maintenance notifications, for one)."""
    return {k: v for k, v in pool.connection_kwargs.items() if k in _ALIAS_KEYS or k.startswith("ssl_")}


def _client_from_cache_alias(alias: str) -> RedisClient:
    from django.conf import settings

    if alias not in settings.CACHES:
        raise ImproperlyConfigured(
            f"RATELIMIT['REDIS_URL'] is not set and RATELIMIT['CACHE_ALIAS'] = {alias!r} is not in CACHES"
        )
    try:
        from django_redis import get_redis_connection

        client = get_redis_connection(alias)
    except NotImplementedError as exc:
        raise ImproperlyConfigured(
            f"RATELIMIT['CACHE_ALIAS'] = {alias!r} is not a django-redis cache; set RATELIMIT['REDIS_URL'] "
            "or point CACHE_ALIAS at a django_redis.cache.RedisCache"
        ) from exc
    pool = getattr(client, "connection_pool", None)
    budget_class = budget_class_for(pool.connection_class) if type(pool) is ConnectionPool else None
    if pool is None or budget_class is None:
        # a Sentinel or cluster cache client: used as configured (its own timeouts and retries apply)
        return client
    # The same server and credentials as the cache, but the limiter's own pool: its timeouts, no
    # retries, and the time budget (the cache may be configured to retry, which must never resend
    # a decision).
    kwargs = _where_and_who(pool)
    if _pool_path():
        return redis.Redis(connection_pool=BudgetBlockingConnectionPool(
            connection_class=budget_class, max_connections=POOL_MAX_CONNECTIONS, timeout=_budget_seconds(), **kwargs,
            **_client_options()))
    return redis.Redis(connection_pool=ConnectionPool(connection_class=budget_class, **kwargs, **_client_options()))


def redacted_url(url: str) -> str:
    """`url` with its password (in the user info or a `password=` query parameter) shown as `***`, for
    printing: "redis://:s3cret@host:6380/1" -> "redis://:***@host:6380/1"."""
    parts = urlsplit(url)
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        url = url.replace(f"{userinfo}@", f"{userinfo.partition(':')[0]}:***@", 1)
    base, question, query = url.partition("?")
    if question:
        query, hash_sign, fragment = query.partition("#")
        fields = ["password=***" if field.startswith("password=") else field for field in query.split("&")]
        url = f"{base}?{'&'.join(fields)}{hash_sign}{fragment}"
    return url


def redis_location() -> str:
    """Where the limiter's Redis is, for a log line: "host:port" (every node of a cluster or sentinel URL,
    comma-separated; a socket's path), from RATELIMIT['REDIS_URL'] or else the LOCATION of the cache
    RATELIMIT['CACHE_ALIAS']. Never a user name or password."""
    from django.conf import settings

    url = ratelimit_settings.REDIS_URL
    if not url:
        location = settings.CACHES.get(ratelimit_settings.CACHE_ALIAS, {}).get("LOCATION") or ""
        urls = [location] if isinstance(location, str) else list(location)
        return ",".join(redis_location_of(str(each)) for each in urls) or f"cache {ratelimit_settings.CACHE_ALIAS!r}"
    return redis_location_of(url)


def redis_location_of(url: str) -> str:
    """The "host:port" part of one Redis URL (its path for a unix socket), without user info."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        return parts.path or url.partition("?")[0].rpartition("@")[2]
    return hosts if "," in hosts or parts.port else f"{hosts}:6379"


def _client_from_settings() -> RedisClient:
    url = ratelimit_settings.REDIS_URL
    return build_client(url) if url else _client_from_cache_alias(ratelimit_settings.CACHE_ALIAS)


_client = SettingsCached(_client_from_settings)


def get_redis() -> RedisClient:
    """The process-wide Redis client for rate limiting (created on first use, rebuilt after every settings
    change). Raises ImproperlyConfigured for a bad configuration, and redis.ConnectionError when a Redis
    Cluster cannot be reached to learn its topology."""
    return _client.get()


# -- the asyncio client -----------------------------------------------------------------------------
# A redis.asyncio client belongs to the event loop it is first used on, so it is not cached here (the async
# service builds one per event loop; building one does no I/O). The budget of an async call is one asyncio
# timeout around it, so these clients need no budget-aware connection classes.

def _async_client_options() -> dict[str, Any]:
    """`_client_options()` for redis.asyncio clients: the same timeouts and handshake, no retries."""
    from redis.asyncio.retry import Retry as AsyncRetry

    return {**_client_options(), "retry": AsyncRetry(NoBackoff(), 0)}


def _build_async_client(url: str) -> AsyncRedisClient:
    """A redis.asyncio client for `url` with the limiter's timeouts (the schemes of `build_client`)."""
    import redis.asyncio
    from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    parts = urlsplit(url)
    options = _async_client_options()
    if _is_cluster(parts.scheme):
        nodes = [AsyncClusterNode(host, port) for host, port in _cluster_nodes(parts.netloc)]
        return AsyncRedisCluster(startup_nodes=nodes, username=unquote(parts.username) if parts.username else None,
                                 password=unquote(parts.password) if parts.password else None,
                                 ssl=parts.scheme == "rediss", **options)
    if parts.scheme == SENTINEL_SCHEME:
        return async_sentinel_master(url, options)
    _check_scheme(parts.scheme)
    return redis.asyncio.Redis.from_url(url, **options)


def _async_client_from_cache_alias(alias: str) -> AsyncRedisClient:
    """The server and credentials of the django-redis cache `alias`, in a redis.asyncio client."""
    import redis.asyncio
    import redis.asyncio.connection as aio

    client = _client_from_cache_alias(alias)
    pool = getattr(client, "connection_pool", None)
    connection_class = async_connection_class(pool) if pool is not None else None
    if pool is None or connection_class is None:
        raise ImproperlyConfigured(
            f"RATELIMIT['CACHE_ALIAS'] = {alias!r} is a Sentinel or cluster cache, which the async limiter "
            "cannot copy: set RATELIMIT['REDIS_URL']"
        )
    kwargs = _where_and_who(pool)
    return redis.asyncio.Redis(connection_pool=aio.ConnectionPool(connection_class=connection_class, **kwargs,
                                                                  **_async_client_options()))


def get_async_redis() -> AsyncRedisClient:
    """A new redis.asyncio client for rate limiting, configured from settings (REDIS_URL, else the
    django-redis cache of CACHE_ALIAS). Use it from one event loop; see `_build_async_client`."""
    url = ratelimit_settings.REDIS_URL
    return _build_async_client(url) if url else _async_client_from_cache_alias(ratelimit_settings.CACHE_ALIAS)
