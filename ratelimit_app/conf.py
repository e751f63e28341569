"""Settings: one RATELIMIT dict in the Django settings, read lazily and validated on first use.

Every key has a default here and an entry in docs/settings.md. Unknown keys raise
ImproperlyConfigured, so a typo is never silently ignored. Changing RATELIMIT in tests
(override_settings) takes effect immediately: the cache is dropped on `setting_changed`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    # Redis connection
    "REDIS_URL": None,  # redis://, rediss://, unix://, redis+cluster://, redis+sentinel://; None: CACHE_ALIAS
    "CACHE_ALIAS": "default",  # a django-redis cache whose client is reused when REDIS_URL is None
    "KEY_PREFIX": "rl",  # prefix of every Redis key the limiter writes
    "SOCKET_CONNECT_TIMEOUT": 0.05,  # seconds to open a connection to Redis
    "SOCKET_TIMEOUT": 0.05,  # seconds to wait for a Redis reply
    "CLUSTER": False,  # treat REDIS_URL as a Redis Cluster node even without the redis+cluster scheme
    "SENTINEL_SERVICE": "mymaster",  # master name for redis+sentinel:// URLs
    # What is limited
    "ENABLED": True,
    "PATH_PREFIXES": ["/api/"],  # the middleware limits these paths ...
    "EXEMPT_PATHS": ["/health"],  # ... except these (prefix match)
    "IP_RATE": "100/m",  # per-client-IP limit applied before authentication; None disables it
    "IP_ALGORITHM": "sliding_window_counter",  # O(1) per address: an abuse guard, approximate is enough
    "DEFAULT_USER_TIER": "free",  # tier of an authenticated user without an API key or own tier
    "ANONYMOUS_TIER": None,  # tier for clients with no key and no user; None: a key is required (401)
    "HEADERS": "both",  # "legacy" (X-RateLimit-*), "ietf" (RateLimit, RateLimit-Policy) or "both"
    "TRUSTED_PROXIES": 0,  # number of trusted proxy hops, or a list of trusted CIDRs
    "IPV6_PREFIX": 64,  # IPv6 clients are grouped by this prefix length
    "API_KEY_HEADER": "X-API-Key",
    # Lookups
    "CACHE_TTL": 5.0,  # seconds a tier or key lookup may be served from cache: the time for a change
    "LOCAL_CACHE_SIZE": 10_000,  # entries of the in-process lookup cache
    "NEGATIVE_CACHE_SIZE": 10_000,  # unknown keys remembered in process
    # When Redis is slow or down
    "FAIL_MODE": "open",  # "open", "closed" or "local"
    "BUDGET_MS": 50,  # limiter time a request may spend before the fail mode applies
    "APP_SERVERS": 1,  # the local fallback enforces each limit divided by this number
    "BREAKER_FAILURES": 3,  # consecutive failures that open the circuit breaker
    "BREAKER_COOLDOWN": 1.0,  # seconds before the first probe; doubles after each failed probe ...
    "BREAKER_MAX_COOLDOWN": 30.0,  # ... up to this cap
    "DENY_CACHE_SIZE": 10_000,  # identities remembered as denied in process until their retry time
    # Observability
    "METRICS_ENABLED": True,
    "METRICS_FLUSH_INTERVAL": 1.0,  # seconds between batched flushes of in-process counters to Redis
    "METRICS_TTL_HOURS": 48,
    "TOP_BLOCKED": 20,  # identities kept in the daily top-blocked list shown to operators
    # Load shedding (docs/protection.md)
    "SHED_CAPACITY": None,  # requests the fleet can hold in flight (counted in Redis); None: no fleet shedder
    "SHED_LOW_AT": 0.8,  # low-priority requests are shed from this fraction of SHED_CAPACITY in flight ...
    "SHED_NORMAL_AT": 0.95,  # ... normal ones from this one; critical ones never
    "SHED_LEASE": 60,  # seconds a request's place in the fleet count lasts if its worker dies
    "SHED_PRIORITIES": {},  # path prefix -> "critical", "normal" or "low" (views may declare their own)
    "SHED_PROCESS_LIMIT": None,  # requests in flight in one process beyond which low ones are shed; None: off
    "SHED_RETRY_AFTER": 1,  # seconds in the Retry-After of a shed request's 503
}

_CHOICES: dict[str, tuple[Any, ...]] = {
    "HEADERS": ("legacy", "ietf", "both"),
    "FAIL_MODE": ("open", "closed", "local"),
}
_POSITIVE_NUMBERS = (
    "SOCKET_CONNECT_TIMEOUT", "SOCKET_TIMEOUT", "CACHE_TTL", "BUDGET_MS", "BREAKER_COOLDOWN",
    "BREAKER_MAX_COOLDOWN", "METRICS_FLUSH_INTERVAL",
)
_POSITIVE_INTEGERS = (
    "LOCAL_CACHE_SIZE", "NEGATIVE_CACHE_SIZE", "APP_SERVERS", "BREAKER_FAILURES", "DENY_CACHE_SIZE",
    "METRICS_TTL_HOURS", "TOP_BLOCKED",
)


def _validate(values: dict[str, Any]) -> None:
    for name, choices in _CHOICES.items():
        if values[name] not in choices:
            raise ImproperlyConfigured(
                f"RATELIMIT['{name}'] is {values[name]!r}; expected one of {', '.join(map(repr, choices))}"
            )
    for name in _POSITIVE_NUMBERS:
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ImproperlyConfigured(f"RATELIMIT['{name}'] is {value!r}; expected a number > 0")
    for name in _POSITIVE_INTEGERS:
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ImproperlyConfigured(f"RATELIMIT['{name}'] is {value!r}; expected an integer >= 1")
    for name in ("PATH_PREFIXES", "EXEMPT_PATHS"):
        value = values[name]
        if isinstance(value, str) or not all(isinstance(item, str) for item in value):
            raise ImproperlyConfigured(f"RATELIMIT['{name}'] must be a list of path prefixes, got {value!r}")
    prefix = values["IPV6_PREFIX"]
    if isinstance(prefix, bool) or not isinstance(prefix, int) or not 1 <= prefix <= 128:
        raise ImproperlyConfigured(f"RATELIMIT['IPV6_PREFIX'] is {prefix!r}; expected an integer from 1 to 128")
    _validate_shedding(values)
    proxies = values["TRUSTED_PROXIES"]
    if not (isinstance(proxies, int) and not isinstance(proxies, bool) and proxies >= 0) and not (
        isinstance(proxies, (list, tuple)) and all(isinstance(item, str) for item in proxies)
    ):
        raise ImproperlyConfigured(
            f"RATELIMIT['TRUSTED_PROXIES'] is {proxies!r}; expected a hop count >= 0 or a list of CIDRs"
        )


def _validate_shedding(values: dict[str, Any]) -> None:
    from .policies import MAX_LIMIT, MAX_PERIOD_SECONDS

    for name in ("SHED_CAPACITY", "SHED_PROCESS_LIMIT"):
        value = values[name]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT):
            raise ImproperlyConfigured(f"RATELIMIT['{name}'] is {value!r}; expected None or an integer from 1 to "
                                       f"{MAX_LIMIT}")
    for name in ("SHED_LOW_AT", "SHED_NORMAL_AT"):
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ImproperlyConfigured(f"RATELIMIT['{name}'] is {value!r}; expected a fraction of SHED_CAPACITY "
                                       "above 0 and at most 1")
    if values["SHED_LOW_AT"] > values["SHED_NORMAL_AT"]:
        raise ImproperlyConfigured(
            f"RATELIMIT['SHED_LOW_AT'] is {values['SHED_LOW_AT']!r}, above RATELIMIT['SHED_NORMAL_AT'] "
            f"({values['SHED_NORMAL_AT']!r}): low-priority requests must be shed first"
        )
    lease = values["SHED_LEASE"]
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0.001 <= lease <= MAX_PERIOD_SECONDS:
        raise ImproperlyConfigured(f"RATELIMIT['SHED_LEASE'] is {lease!r}; expected seconds from 0.001 to "
                                   f"{MAX_PERIOD_SECONDS}")
    retry = values["SHED_RETRY_AFTER"]
    if isinstance(retry, bool) or not isinstance(retry, int) or not 1 <= retry <= 86400:
        raise ImproperlyConfigured(f"RATELIMIT['SHED_RETRY_AFTER'] is {retry!r}; expected whole seconds from 1 to "
                                   "86400")
    priorities = values["SHED_PRIORITIES"]
    if not isinstance(priorities, dict) or not all(
            isinstance(prefix, str) and prefix.startswith("/") and priority in ("critical", "normal", "low")
            for prefix, priority in priorities.items()):
        raise ImproperlyConfigured(
            f"RATELIMIT['SHED_PRIORITIES'] is {priorities!r}; expected a dict of path prefixes ('/api/reports/') to "
            "'critical', 'normal' or 'low'"
        )


class RateLimitSettings:
    """Attribute access to the merged RATELIMIT settings: `ratelimit_settings.FAIL_MODE`."""

    def __init__(self) -> None:
        self._values: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        user = getattr(django_settings, "RATELIMIT", {}) or {}
        if not isinstance(user, dict):
            raise ImproperlyConfigured(f"RATELIMIT must be a dict, got {type(user).__name__}")
        unknown = sorted(set(user) - set(DEFAULTS))
        if unknown:
            raise ImproperlyConfigured(
                f"RATELIMIT has unknown setting(s) {', '.join(unknown)}; see docs/settings.md for the known ones"
            )
        values = {**DEFAULTS, **user}
        _validate(values)
        return values

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"no RATELIMIT setting named {name!r}")
        if self._values is None:
            self._values = self._load()
        return self._values[name]

    def as_dict(self) -> dict[str, Any]:
        """All settings with defaults applied (validated)."""
        if self._values is None:
            self._values = self._load()
        return dict(self._values)

    def reload(self) -> None:
        """Drop the cached values; the next access reads and validates settings.RATELIMIT again."""
        self._values = None


ratelimit_settings = RateLimitSettings()

#: Callbacks run after RATELIMIT changes (connection and lookup caches register here).
_reload_hooks: list[Any] = []


def on_reload(callback: Any) -> Any:
    """Register `callback()` to run whenever settings.RATELIMIT changes; usable as a decorator."""
    _reload_hooks.append(callback)
    return callback


@receiver(setting_changed)
def _reload_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting in ("RATELIMIT", "CACHES"):
        ratelimit_settings.reload()
        for callback in _reload_hooks:
            callback()


T = TypeVar("T")


class SettingsCached(Generic[T]):
    """A per-process value built from the settings on first use and rebuilt after RATELIMIT changes.

    For everything the request path derives from settings (parsed rates, the Redis client, the limiter
    service), so no request re-reads or re-validates them. Thread-safe: concurrent first uses build the
    value once.
    """

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._value: T | None = None
        self._lock = threading.Lock()
        on_reload(self.clear)

    def get(self) -> T:
        """The value, built now if settings changed since it was last built."""
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._build()
                value = self._value
        return value

    def clear(self) -> None:
        """Forget the value; the next `get` builds it from the current settings."""
        with self._lock:
            self._value = None
