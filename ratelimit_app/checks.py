"""System checks of the RATELIMIT settings, the Redis and tiers they name, GET /metrics and the shared cache
(docs/settings.md, "What `check` validates"). No message shows the value of a secret setting."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, router
from django.urls import URLPattern, URLResolver, get_resolver
from redis.cluster import RedisCluster

from .conf.redisurl import CLUSTER_SCHEME, host_ports
from .conf.settings import in_test_run, ratelimit_settings, read_settings
from .core.exceptions import REDIS_CLIENT_ERRORS, refuses_scripts
from .core.scripts import decide_source

#: The oldest Redis server the decision script runs on (SET ... KEEPTTL and PXAT came in 6.2).
_MIN_REDIS_VERSION = (6, 2)

_SETTINGS_HINT = "Fix settings.RATELIMIT; docs/settings.md lists every setting and its accepted values."


@checks.register("ratelimit")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every RATELIMIT setting is valid, and the Redis it names (none with BACKEND "memory") usable."""
    ratelimit_settings.reload()
    values, errors = read_settings()
    if errors:
        return [checks.Error(error.message, hint=_SETTINGS_HINT, id="ratelimit.E001") for error in errors]
    messages = _debug_only_messages(values)
    if values["BACKEND"] == "memory":
        return messages  # decisions are made in process: no Redis to ask
    from .service.connection import get_redis

    try:
        client = get_redis()
        client.ping()
    except ImproperlyConfigured as exc:
        return [*messages, checks.Error(str(exc), hint="Set RATELIMIT['REDIS_URL'].", id="ratelimit.E002")]
    except REDIS_CLIENT_ERRORS as exc:
        # building a cluster client already talks to a node, so it can fail here as well as the PING
        return [*messages, *_unanswered(exc)]
    return [*messages, *_topology_errors(client), *_version_errors(client), *_scripting_errors(client)]


def _debug_only_messages(values: dict[str, Any]) -> list[checks.CheckMessage]:
    """E040 (CLOCK_SHIFT), W040 (the memory backend counting alone) and W041 (ENABLED False) outside tests."""
    messages: list[checks.CheckMessage] = []
    debug_or_tests = bool(django_settings.DEBUG) or in_test_run()
    if values["CLOCK_SHIFT"] and not debug_or_tests:
        messages.append(checks.Error(
            "RATELIMIT['CLOCK_SHIFT'] is True with DEBUG off outside a test run: it lets tests move the "
            "limiter's clock, and is never honoured here.",
            hint="Remove CLOCK_SHIFT from these settings: the test kit (ratelimit_app.testing) sets it for "
                 "each test itself.", id="ratelimit.E040"))
    if values["BACKEND"] == "memory":
        processes = max(int(values["APP_SERVERS"]), _web_concurrency())
        if processes > 1 or not debug_or_tests:
            where = f"{processes} processes" if processes > 1 else "DEBUG off outside a test run"
            messages.append(checks.Warning(
                f"RATELIMIT['BACKEND'] is 'memory' with {where}: each process counts its clients alone, so "
                "the limits hold per process, not for the site.",
                hint="Use BACKEND 'redis' (the default) wherever more than one process serves requests; "
                     "'memory' is for test suites without Redis.", id="ratelimit.W040"))
    if not values["ENABLED"] and not debug_or_tests:
        messages.append(checks.Warning(
            "RATELIMIT['ENABLED'] is False with DEBUG off outside a test run: no limit of ours applies (the "
            "middleware, the DRF throttles, the decorators, concurrency limits and load shedding let every "
            "request through).",
            hint="Remove ENABLED (it defaults to True); if this site runs without limits on purpose, add "
                 "'ratelimit.W041' to SILENCED_SYSTEM_CHECKS.", id="ratelimit.W041"))
    return messages


def _web_concurrency() -> int:
    """The worker processes WEB_CONCURRENCY asks of gunicorn or uvicorn (1 when unset or not a number)."""
    try:
        return int(os.environ.get("WEB_CONCURRENCY", "1"))
    except ValueError:
        return 1


def _fail_mode_hint(what: str) -> str:
    return f"{what}; until then requests follow RATELIMIT['FAIL_MODE'] = {ratelimit_settings.FAIL_MODE!r}."


def _unanswered(exc: Exception) -> list[checks.CheckMessage]:
    """Why Redis could not be used: refused (E020), not the topology configured (E021), or down (W001)."""
    if isinstance(exc, (redis.ResponseError, redis.AuthenticationError)):
        return [checks.Error(f"Redis for rate limiting refused the connection: {exc}", id="ratelimit.E020",
                             hint=_fail_mode_hint("Fix the database or the credentials of RATELIMIT['REDIS_URL']"))]
    if _configured_cluster() and _standalone_answers():
        return [checks.Error(
            "RATELIMIT['CLUSTER'] is True or RATELIMIT['REDIS_URL'] is a redis+cluster:// URL, but the server it "
            "names is not a cluster node: every decision would fail", id="ratelimit.E021",
            hint=_fail_mode_hint("Use a redis:// URL and CLUSTER False for a single server"))]
    return [checks.Warning(
        f"Redis for rate limiting does not answer: {exc}", id="ratelimit.W001",
        hint=f"Requests follow RATELIMIT['FAIL_MODE'] = {ratelimit_settings.FAIL_MODE!r} until it does, and "
             "edits of tiers, keys and rules reach other app servers within RATELIMIT['CACHE_TTL'] "
             f"({ratelimit_settings.CACHE_TTL:g} s) instead of about a second.")]


def _configured_cluster() -> bool:
    url = ratelimit_settings.REDIS_URL
    scheme = urlsplit(url).scheme if url else ""
    return scheme == CLUSTER_SCHEME or (bool(ratelimit_settings.CLUSTER) and scheme in ("redis", "rediss"))


def _standalone_answers() -> bool:
    """True when the first node of the configured cluster URL answers as a single server."""
    from .service.connection import socket_timeouts

    parts = urlsplit(ratelimit_settings.REDIS_URL)
    host, port = (host_ports(parts.netloc) or [("", 0)])[0] if parts.scheme == CLUSTER_SCHEME else \
        (parts.hostname or "localhost", parts.port or 6379)
    connect, read = socket_timeouts()
    with redis.Redis(host=host, port=port, username=unquote(parts.username) if parts.username else None,
                     password=unquote(parts.password) if parts.password else None,
                     ssl=parts.scheme == "rediss", socket_connect_timeout=connect, socket_timeout=read) as node:
        return _cluster_enabled(node) is False


def _cluster_enabled(client: Any) -> bool | None:
    """Whether the server `client` reaches is a cluster node; None when it does not say (down, INFO denied)."""
    try:
        return bool(int(client.info("cluster").get("cluster_enabled", 0)))
    except REDIS_CLIENT_ERRORS:
        return None


def _topology_errors(client: Any) -> list[checks.CheckMessage]:
    """E021 when a client built for a single server reaches a cluster node (other shards answer MOVED)."""
    if isinstance(client, RedisCluster) or not _cluster_enabled(client):
        return []
    return [checks.Error(
        "RATELIMIT['REDIS_URL'] names a Redis Cluster node as a single server: decisions whose keys live on "
        "another shard would fail", id="ratelimit.E021",
        hint=_fail_mode_hint("Use a redis+cluster:// URL (or RATELIMIT['CLUSTER'] = True)"))]


def _version_errors(client: Any) -> list[checks.CheckMessage]:
    """E005 when a server (every node of a cluster) is older than _MIN_REDIS_VERSION."""
    try:
        too_old = _old_servers(_server_versions(_server_info(client)))
    except REDIS_CLIENT_ERRORS:
        return []  # INFO renamed or denied by an ACL: the version cannot be read, and is not guessed
    return [checks.Error(
        f"Redis for rate limiting is older than {'.'.join(map(str, _MIN_REDIS_VERSION))}: {', '.join(too_old)}",
        hint="Upgrade Redis: the decision script writes with SET ... KEEPTTL and PXAT (Redis 6.2+); "
             "until then every decision fails and follows RATELIMIT['FAIL_MODE'].",
        id="ratelimit.E005",
    )] if too_old else []


def _scripting_errors(client: Any) -> list[checks.CheckMessage]:
    """E007 when a server (every master of a cluster) refuses to load the decision script."""
    try:
        client.script_load(decide_source())
    except REDIS_CLIENT_ERRORS as exc:
        if not refuses_scripts(exc):
            return []
        return [checks.Error(
            f"Redis for rate limiting cannot run Lua scripts: SCRIPT LOAD of the decision script answered {exc}",
            hint=_fail_mode_hint("Run a server with Lua scripting (Valkey 9.1+: its lua module loaded; an ACL "
                                 "that allows @scripting)"),
            id="ratelimit.E007")]
    return []


def _server_info(client: Any) -> dict[str, Any]:
    """INFO server of the client's server, or of every node of a cluster client (redis-py asks one by default)."""
    if isinstance(client, RedisCluster):
        return client.info("server", target_nodes=RedisCluster.ALL_NODES)
    return client.info("server")


def _server_versions(info: dict[str, Any]) -> dict[str, str]:
    """The redis_version of each server in an INFO server reply: {"": version}, or {node: version}."""
    if "redis_version" in info:
        return {"": str(info["redis_version"])}
    return {str(node): str(reply["redis_version"]) for node, reply in info.items()
            if isinstance(reply, dict) and "redis_version" in reply}


def _old_servers(versions: dict[str, str]) -> list[str]:
    """The servers older than _MIN_REDIS_VERSION, as "version" or "node: version"."""
    old = []
    for node, text in sorted(versions.items()):
        parts = tuple(int(part) for part in text.split(".")[:2] if part.isdigit())
        if parts < _MIN_REDIS_VERSION:
            old.append(f"{node}: {text}" if node else text)
    return old


@checks.register("ratelimit", checks.Tags.database)
def check_tiers(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E003: the tiers that ANONYMOUS_TIER and DEFAULT_USER_TIER name exist."""
    from .models import Tier

    alias = router.db_for_read(Tier)
    values, errors = read_settings()
    if not databases or alias not in databases or errors:
        return []  # no database to ask, or invalid settings (check_settings reports those)
    named = {name: values[name] for name in ("ANONYMOUS_TIER", "DEFAULT_USER_TIER") if values[name] is not None}
    if not named:
        return []
    try:
        existing = set(Tier.objects.using(alias).filter(slug__in=set(named.values())).values_list("slug", flat=True))
    except DatabaseError:
        return []  # not migrated yet: `migrate` creates the table (and seeds the default tiers)
    if set(named.values()) <= existing:
        return []
    slugs = ", ".join(map(repr, Tier.objects.using(alias).order_by("slug").values_list("slug", flat=True)))
    return [checks.Error(f"RATELIMIT['{name}'] is {slug!r}, which names no tier; expected the slug of an existing "
                         f"tier ({slugs or 'there are none yet'}) or None", id="ratelimit.E003",
                         hint="Create the tier in the admin (Rate limiting > Tiers), or change the setting.")
            for name, slug in named.items() if slug not in existing]


@checks.register("ratelimit", checks.Tags.urls)
def check_metrics_endpoint(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """When the URLconf routes GET /metrics: prometheus-client is installed (E004), and Prometheus may read
    it (W002)."""
    from .observability.metrics_endpoint import get_access, metrics_view, prometheus_missing

    if not _routes(metrics_view):
        return []
    messages: list[checks.CheckMessage] = []
    missing = prometheus_missing()
    if missing is not None:
        messages.append(checks.Error(f"The URLconf includes ratelimit_app.urls (GET /metrics), but {missing}",
                                     hint="Install it, or remove the include; until then GET /metrics answers 501.",
                                     id="ratelimit.E004"))
    if not read_settings()[1] and not get_access().configured:
        messages.append(checks.Warning(
            "GET /metrics answers only to staff sessions: neither RATELIMIT['METRICS_TOKEN'] nor "
            "RATELIMIT['METRICS_ALLOWED_IPS'] is set, so Prometheus gets 403.",
            hint="Set RATELIMIT['METRICS_TOKEN'] (Prometheus sends it as a bearer token) or "
                 "RATELIMIT['METRICS_ALLOWED_IPS'] (the addresses of your Prometheus servers).", id="ratelimit.W002"))
    return messages


def _routes(view: Any) -> bool:
    """True when the root URLconf routes `view` (at any depth of includes)."""

    def walk(patterns: Any) -> bool:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                if walk(pattern.url_patterns):
                    return True
            elif isinstance(pattern, URLPattern) and pattern.callback is view:
                return True
        return False

    try:
        return walk(get_resolver().url_patterns)
    except Exception:  # a URLconf that does not import: Django's own URL checks report it
        return False


#: Cache backends that talk to a server, and where each takes its read timeout: an OPTIONS key, and
#: the name of a LOCATION query parameter (None: none).
_CACHE_READ_TIMEOUTS: dict[str, tuple[str, str | None]] = {
    "django_redis.cache.RedisCache": ("SOCKET_TIMEOUT", "socket_timeout"),
    "django.core.cache.backends.redis.RedisCache": ("socket_timeout", "socket_timeout"),
    "django.core.cache.backends.memcached.PyMemcacheCache": ("timeout", None),
}


@checks.register("ratelimit", checks.Tags.caches)
def check_shared_cache(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W020 when the cache the lookups share (CACHE_ALIAS) waits for its server without a timeout: requests
    wait at most BUDGET_MS, but a hung read keeps that process off the shared cache until it ends."""
    values, errors = read_settings()
    if errors:
        return []  # check_settings reports them
    alias = values["CACHE_ALIAS"]
    config = getattr(django_settings, "CACHES", {}).get(alias)
    if not isinstance(config, dict):
        return []
    known = _CACHE_READ_TIMEOUTS.get(config.get("BACKEND", ""))
    if known is None or _sets_timeout(config, *known):
        return []
    option = known[0]
    return [checks.Warning(
        f"CACHES[{alias!r}] (RATELIMIT['CACHE_ALIAS'], the lookups' shared cache) sets no socket timeout "
        f"(OPTIONS {option!r}): a cache server that stops answering holds its reads until the operating "
        "system gives up. Requests wait for it at most RATELIMIT['BUDGET_MS'] and then read the database, "
        "but that process stops using the shared cache until the hung read ends.",
        hint=f"Set CACHES[{alias!r}]['OPTIONS'][{option!r}] (seconds, for example 0.5), and a connect "
             "timeout likewise.", id="ratelimit.W020")]


def _sets_timeout(config: dict[str, Any], option: str, query: str | None) -> bool:
    """True when a cache's settings give its connections a read timeout (see _CACHE_READ_TIMEOUTS)."""
    options = config.get("OPTIONS") or {}
    pool = options.get("CONNECTION_POOL_KWARGS") or {}
    if options.get(option) is not None or (query is not None and pool.get(query) is not None):
        return True
    locations = config.get("LOCATION") or []
    locations = [locations] if isinstance(locations, str) else locations
    if query is None or not locations:
        return False
    return all(parse_qs(urlsplit(str(location)).query).get(query) for location in locations)
