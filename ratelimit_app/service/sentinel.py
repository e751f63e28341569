"""Redis Sentinel: find the current master of a service through a group of sentinels."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
from django.core.exceptions import ImproperlyConfigured
from redis.connection import ConnectionPool
from redis.sentinel import Sentinel

from ..conf import redisurl
from ..conf.settings import ratelimit_settings
from ..core.redispy import BudgetConnection, BudgetSentinelConnection


def host_ports(netloc: str, what: str, example: str) -> list[tuple[str, int]]:
    """(host, port) of every "host:port" in the comma-separated network location of a URL (a cluster's
    nodes, a sentinel's addresses); a malformed item is an ImproperlyConfigured naming REDIS_URL (and
    never quoting it: the URL may hold a password)."""
    found = redisurl.host_ports(netloc)
    if found is None:
        raise ImproperlyConfigured(f"RATELIMIT['REDIS_URL']: each {what} must be host:port ({example})")
    return found


def _parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, int, str | None]:
    """Split "redis+sentinel://[:PASSWORD@]host:port,host:port/SERVICE[/DB]" into (sentinels, service, db,
    the master's password)."""
    parts = urlsplit(url)
    hosts = host_ports(parts.netloc, "sentinel address", "redis+sentinel://host:26379,host:26380/SERVICE/DB")
    segments = [s for s in parts.path.split("/") if s]
    service = segments[0] if segments else ratelimit_settings.SENTINEL_SERVICE
    db_text = segments[1] if len(segments) > 1 else parse_qs(parts.query).get("db", ["0"])[0]
    if not db_text.isdigit():
        raise ImproperlyConfigured(f"RATELIMIT['REDIS_URL']: database {db_text!r} must be a number")
    return hosts, service, int(db_text), unquote(parts.password) if parts.password else None


def _sentinel_options(hosts: list[tuple[str, int]], options: dict[str, Any]) -> dict[str, Any]:
    """`options` for asking the sentinels: each gets an equal share of the connect timeout, so asking all of
    them cannot take longer than connecting to one server."""
    return {**options, "socket_connect_timeout": options["socket_connect_timeout"] / (len(hosts) or 1)}


def sentinel_master(url: str, options: dict[str, Any]) -> redis.Redis:
    """A client that always talks to the master the sentinels currently name. `options` are the limiter's
    client options (timeouts, no retries). The password in the URL is the master's; the sentinels are asked
    without one."""
    hosts, service, db, password = _parse_sentinel_url(url)
    sentinel_options = _sentinel_options(hosts, options)
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_options, **options)
    # the sentinels are asked inside the same time budget as the master (redis.Redis takes no
    # connection class of its own, so each sentinel client gets a pool of budget-aware connections)
    sentinel.sentinels = [
        redis.Redis(connection_pool=ConnectionPool(connection_class=BudgetConnection, host=host, port=port,
                                                   **sentinel_options))
        for host, port in hosts
    ]
    return sentinel.master_for(service, db=db, password=password, connection_class=BudgetSentinelConnection)


def async_sentinel_master(url: str, options: dict[str, Any]) -> redis.asyncio.Redis:
    """`sentinel_master` for asyncio (the async service bounds the whole call, sentinel lookups included,
    with one asyncio timeout)."""
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel

    hosts, service, db, password = _parse_sentinel_url(url)
    sentinel = AsyncSentinel(hosts, sentinel_kwargs=_sentinel_options(hosts, options), **options)
    return sentinel.master_for(service, db=db, password=password)
