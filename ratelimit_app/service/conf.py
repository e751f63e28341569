"""Settings: one RATELIMIT dict in the Django settings, read lazily and validated on first use.

Every key has a default here and an entry in docs/settings.md. Every value is validated here, and only
here (`setting_errors`): an invalid one raises ImproperlyConfigured naming the setting and the accepted
values, and `manage.py check` reports each one (ratelimit.E001). Unknown keys are refused too, so a typo
is never silently ignored. Changing RATELIMIT in tests
(override_settings) takes effect immediately: the cache is dropped on `setting_changed`.
"""

from __future__ import annotations

import ipaddress
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..core.engine import CONNECTION_MODES
from ..core.keys import PREFIX_PATTERN
from ..core.policies import ALGORITHMS, MAX_LIMIT, MAX_PERIOD_SECONDS, InvalidPolicy, Policy, parse_rate

DEFAULTS: dict[str, Any] = {
    # Where decisions are made
    "BACKEND": "redis",  # "redis": shared by every process; "memory": this process only (test suites without Redis)
    # Redis connection
    "REDIS_URL": None,  # redis://, rediss://, unix://, redis+cluster://, redis+sentinel://; None: CACHE_ALIAS
    "CACHE_ALIAS": "default",  # a django-redis cache whose client is reused when REDIS_URL is None
    "KEY_PREFIX": "rl",  # prefix of every Redis key the limiter writes
    "SOCKET_CONNECT_TIMEOUT": 0.05,  # seconds to open a connection to Redis
    "SOCKET_TIMEOUT": 0.05,  # seconds to wait for a Redis reply
    "CLUSTER": False,  # treat REDIS_URL as a Redis Cluster node even without the redis+cluster scheme
    "SENTINEL_SERVICE": "mymaster",  # master name for redis+sentinel:// URLs
    "CONNECTIONS": "auto",  # "own", "pool", or "auto": pool under gevent/eventlet, else own
    # What is limited
    "ENABLED": True,  # False: no limit of ours applies (middleware, throttles, decorators, shedding); no Redis call
    "PATH_PREFIXES": ["/api/"],  # the middleware limits these paths ...
    "EXEMPT_PATHS": ["/health"],  # ... except these (prefix match)
    "IP_RATE": "100/m",  # per-client-IP limit applied before authentication; None disables it
    "IP_ALGORITHM": "sliding_window_counter",  # O(1) per address: an abuse guard, approximate is enough
    "IP_SHADOW": False,  # True: the per-IP limit is a dry run (counted, never refuses; see docs/plans.md)
    "DEFAULT_USER_TIER": "free",  # tier of an authenticated user without an API key or own tier
    "ANONYMOUS_TIER": None,  # tier for clients with no key and no user; None: a key is required (401)
    "HEADERS": "both",  # "legacy" (X-RateLimit-*), "ietf" (RateLimit, RateLimit-Policy) or "both"
    "HEADER_DRAFT": "draft-11",  # the draft-ietf-httpapi-ratelimit-headers revision the IETF fields follow
    "ERROR_FORMAT": "json",  # body of 429/503/401/403: "json" or "problem" (RFC 9457 problem+json)
    "NINJA_ERROR_FORMAT": "ninja",  # 429 of our Django Ninja throttles: Ninja's answer, or "ratelimit" (ours)
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
    "METRICS_TOKEN": None,  # GET /metrics answers to "Authorization: Bearer <this>" (and to staff sessions)
    "METRICS_ALLOWED_IPS": [],  # ... and to client IPs in these CIDRs
    # Load shedding (docs/protection.md)
    "SHED_CAPACITY": None,  # requests the fleet can hold in flight (counted in Redis); None: no fleet shedder
    "SHED_LOW_AT": 0.8,  # low-priority requests are shed from this fraction of SHED_CAPACITY in flight ...
    "SHED_NORMAL_AT": 0.95,  # ... normal ones from this one; critical ones never
    "SHED_LEASE": 60,  # seconds a request's place in the fleet count lasts if its worker dies
    "SHED_PRIORITIES": {},  # path prefix -> "critical", "normal" or "low" (views may declare their own)
    "SHED_PROCESS_LIMIT": None,  # requests in flight in one process beyond which low ones are shed; None: off
    "SHED_RETRY_AFTER": 1,  # seconds in the Retry-After of a shed request's 503
    # Tests (ratelimit_app.testing)
    "CLOCK_SHIFT": False,  # True lets tests move the limiter's clock; honoured only with DEBUG or in a test run
}

#: Policy name of the per-IP limit (RATELIMIT['IP_RATE']); tier limits may not use it, so the two
#: never share a Redis key (ratelimit_app.models.TierLimit refuses it, down to a database constraint).
IP_POLICY_NAME = "ip"

_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "redis+sentinel")
#: The values of RATELIMIT['BACKEND'] (docs/testing.md tells when "memory" fits).
BACKENDS = ("redis", "memory")
_TIER_SLUG = re.compile(r"^[-a-zA-Z0-9_]+$")  # what Tier.slug (a SlugField) accepts
_HEADER_NAME = re.compile(r"^[A-Za-z0-9-]{1,100}$")
_TOKEN = re.compile(r"^[\x21-\x7e]{16,}$")  # printable ASCII, no spaces: it travels in a header
_RATE_EXAMPLES = "a rate 'LIMIT/PERIOD' with LIMIT >= 1, such as '100/m', '10/30s', '5000/h' or '1000/d'"


@dataclass(frozen=True)
class SettingError:
    """One invalid setting: `setting` is its name in RATELIMIT, `message` says what it is and what is
    accepted ("RATELIMIT['KEY_PREFIX'] is 'has space'; expected 1 to 64 letters, ...")."""

    setting: str
    message: str


def _integer(value: Any, low: int, high: int | None = None) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high))


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _path_prefixes(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(item, str) and item.startswith("/") for item in value)


def _redis_url(value: Any) -> bool:
    return value is None or (isinstance(value, str) and urlsplit(value).scheme in _REDIS_SCHEMES)


def _cidr(text: Any) -> bool:
    try:
        ipaddress.ip_network(text.strip(), strict=False)
    except (AttributeError, TypeError, ValueError):
        return False
    return True


def _cidr_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(_cidr(item) for item in value)


_NUMBER = (_positive_number, "a number of seconds > 0")
_COUNT = (lambda value: _integer(value, 1), "an integer >= 1")
_BOOLEAN = (lambda value: isinstance(value, bool), "True or False")
_TIER = (lambda value: value is None or (isinstance(value, str) and bool(_TIER_SLUG.match(value))),
         "None or the slug of a tier (letters, digits, '-' or '_'), such as 'free'")

_OPTIONAL_LIMIT = (lambda value: value is None or _integer(value, 1, MAX_LIMIT),
                   f"None or an integer from 1 to {MAX_LIMIT}")
_FRACTION = (lambda value: isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1,
             "a fraction of SHED_CAPACITY above 0 and at most 1")
_PRIORITIES = ("critical", "normal", "low")

#: For each setting except IP_RATE (see `_ip_rate_error`): a test of the value, and the accepted values.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "BACKEND": (lambda value: value in BACKENDS, f"one of {', '.join(map(repr, BACKENDS))}"),
    "REDIS_URL": (_redis_url, f"None or a URL with scheme {', '.join(_REDIS_SCHEMES)}"),
    "CACHE_ALIAS": (lambda value: isinstance(value, str) and bool(value), "the name of a cache in settings.CACHES"),
    "KEY_PREFIX": (lambda value: isinstance(value, str) and bool(PREFIX_PATTERN.match(value)),
                   "1 to 64 letters, digits, '_', '.', ':' or '-'"),
    "SOCKET_CONNECT_TIMEOUT": _NUMBER,
    "SOCKET_TIMEOUT": _NUMBER,
    "CLUSTER": _BOOLEAN,
    "SENTINEL_SERVICE": (lambda value: isinstance(value, str) and bool(value.strip()),
                         "the name of a Sentinel master, such as 'mymaster'"),
    "CONNECTIONS": (lambda value: value in CONNECTION_MODES, f"one of {', '.join(map(repr, CONNECTION_MODES))}"),
    "ENABLED": _BOOLEAN,
    "PATH_PREFIXES": (_path_prefixes, "a list of path prefixes, each starting with '/', such as ['/api/']"),
    "EXEMPT_PATHS": (_path_prefixes, "a list of path prefixes, each starting with '/', such as ['/health']"),
    "IP_ALGORITHM": (lambda value: value in ALGORITHMS, f"one of {', '.join(map(repr, ALGORITHMS))}"),
    "IP_SHADOW": _BOOLEAN,
    "DEFAULT_USER_TIER": _TIER,
    "ANONYMOUS_TIER": _TIER,
    "HEADERS": (lambda value: value in ("legacy", "ietf", "both"), "one of 'legacy', 'ietf', 'both'"),
    "HEADER_DRAFT": (lambda value: value in ("draft-11",), "'draft-11' (the only revision supported)"),
    "ERROR_FORMAT": (lambda value: value in ("json", "problem"), "one of 'json', 'problem'"),
    "NINJA_ERROR_FORMAT": (lambda value: value in ("ninja", "ratelimit"), "one of 'ninja', 'ratelimit'"),
    "TRUSTED_PROXIES": (lambda value: _integer(value, 0) or _cidr_list(value),
                        "a hop count >= 0 or a list of proxy CIDRs such as ['10.0.0.0/8', '2001:db8::/32']"),
    "IPV6_PREFIX": (lambda value: _integer(value, 1, 128), "an integer from 1 to 128"),
    "API_KEY_HEADER": (lambda value: isinstance(value, str) and bool(_HEADER_NAME.match(value)),
                       "an HTTP header name of letters, digits and '-', such as 'X-API-Key'"),
    "CACHE_TTL": _NUMBER,
    "LOCAL_CACHE_SIZE": _COUNT,
    "NEGATIVE_CACHE_SIZE": _COUNT,
    "FAIL_MODE": (lambda value: value in ("open", "closed", "local"), "one of 'open', 'closed', 'local'"),
    "BUDGET_MS": (_positive_number, "a number of milliseconds > 0"),
    "APP_SERVERS": _COUNT,
    "BREAKER_FAILURES": _COUNT,
    "BREAKER_COOLDOWN": _NUMBER,
    "BREAKER_MAX_COOLDOWN": _NUMBER,
    "DENY_CACHE_SIZE": _COUNT,
    "METRICS_ENABLED": _BOOLEAN,
    "METRICS_FLUSH_INTERVAL": _NUMBER,
    "METRICS_TTL_HOURS": _COUNT,
    "TOP_BLOCKED": _COUNT,
    "METRICS_TOKEN": (lambda value: value is None or (isinstance(value, str) and bool(_TOKEN.match(value))),
                      "None or a secret of at least 16 characters without spaces, such as the output of "
                      "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"),
    "METRICS_ALLOWED_IPS": (_cidr_list, "a list of CIDRs or addresses, such as ['10.0.0.0/8', '127.0.0.1']"),
    "SHED_CAPACITY": _OPTIONAL_LIMIT,
    "SHED_LOW_AT": _FRACTION,
    "SHED_NORMAL_AT": _FRACTION,
    "SHED_LEASE": (lambda value: (isinstance(value, (int, float)) and not isinstance(value, bool)
                                  and 0.001 <= value <= MAX_PERIOD_SECONDS),
                   f"seconds from 0.001 to {MAX_PERIOD_SECONDS}"),
    "SHED_PRIORITIES": (lambda value: isinstance(value, dict) and all(
                            isinstance(prefix, str) and prefix.startswith("/") and priority in _PRIORITIES
                            for prefix, priority in value.items()),
                        "a dict of path prefixes ('/api/reports/') to 'critical', 'normal' or 'low'"),
    "SHED_PROCESS_LIMIT": _OPTIONAL_LIMIT,
    "SHED_RETRY_AFTER": (lambda value: _integer(value, 1, 86400), "whole seconds from 1 to 86400"),
    "CLOCK_SHIFT": _BOOLEAN,
}


def _ip_rate_error(values: dict[str, Any]) -> str | None:
    """What is wrong with IP_RATE, or None. Parsed exactly as the middleware parses it."""
    rate = values["IP_RATE"]
    if rate is None:
        return None
    algorithm = values["IP_ALGORITHM"] if values["IP_ALGORITHM"] in ALGORITHMS else "sliding_window"
    try:
        # a limit of 0 is refused even where rates may deny everything (DRF's "0/day"): per IP, it would
        # lock every client out, the admin included if its paths are limited
        if parse_rate(rate)[0] < 1:
            raise InvalidPolicy("a per-IP limit of 0 would refuse every client")
        Policy.parse(rate, name=IP_POLICY_NAME, algorithm=algorithm)
    except InvalidPolicy as exc:
        problem = str(exc)
    else:
        return None
    return f"RATELIMIT['IP_RATE'] is {rate!r} ({problem}); expected {_RATE_EXAMPLES}, or None to disable it"


def setting_errors(values: dict[str, Any]) -> list[SettingError]:
    """Every invalid value among `values` (all settings, defaults applied), in DEFAULTS order.

    The one place settings are validated: what passes here, the request path can use as it is.
    """
    errors = [
        SettingError(name, f"RATELIMIT['{name}'] is {values[name]!r}; expected {expected}")
        for name, (valid, expected) in _RULES.items() if not valid(values[name])
    ]
    ip_rate = _ip_rate_error(values)
    if ip_rate is not None:
        errors.append(SettingError("IP_RATE", ip_rate))
    alias = values["CACHE_ALIAS"]
    if values["REDIS_URL"] is None and isinstance(alias, str) and alias not in getattr(django_settings, "CACHES", {}):
        # with a REDIS_URL, an alias that is not a cache only means "no shared lookup cache" (see lookups)
        errors.append(SettingError("CACHE_ALIAS", (
            f"RATELIMIT['CACHE_ALIAS'] is {alias!r}, which is not in settings.CACHES; expected the name of a "
            "django-redis cache in settings.CACHES (RATELIMIT['REDIS_URL'] is None), or set REDIS_URL")))
    cooldown, longest = values["BREAKER_COOLDOWN"], values["BREAKER_MAX_COOLDOWN"]
    if _positive_number(cooldown) and _positive_number(longest) and longest < cooldown:
        errors.append(SettingError("BREAKER_MAX_COOLDOWN", (
            f"RATELIMIT['BREAKER_MAX_COOLDOWN'] is {longest!r}; expected a number of seconds >= "
            f"RATELIMIT['BREAKER_COOLDOWN'] ({cooldown!r})")))
    low, normal = values["SHED_LOW_AT"], values["SHED_NORMAL_AT"]
    if _RULES["SHED_LOW_AT"][0](low) and _RULES["SHED_NORMAL_AT"][0](normal) and low > normal:
        errors.append(SettingError("SHED_LOW_AT", (
            f"RATELIMIT['SHED_LOW_AT'] is {low!r}, above RATELIMIT['SHED_NORMAL_AT'] ({normal!r}); expected a "
            "fraction <= SHED_NORMAL_AT: low-priority requests must be shed first")))
    order = list(DEFAULTS)
    return sorted(errors, key=lambda error: order.index(error.setting))


def read_settings() -> tuple[dict[str, Any], list[SettingError]]:
    """settings.RATELIMIT merged over DEFAULTS (and the test kit's overlay over both: `set_overlay`), and
    every problem with it (an empty list when valid)."""
    user = getattr(django_settings, "RATELIMIT", {}) or {}
    if not isinstance(user, dict):
        return dict(DEFAULTS), [SettingError("RATELIMIT", f"RATELIMIT must be a dict, got {type(user).__name__}")]
    unknown = sorted(set(user) - set(DEFAULTS))
    values = {**DEFAULTS, **{name: value for name, value in user.items() if name in DEFAULTS}, **_overlay}
    errors = setting_errors(values)
    if unknown:
        errors.insert(0, SettingError("RATELIMIT", (
            f"RATELIMIT has unknown setting(s) {', '.join(unknown)}; expected only the settings listed in "
            "docs/settings.md")))
    return values, errors


def in_test_run() -> bool:
    """True while Django's test environment is set up (`django.test.utils.setup_test_environment`, which
    Django's test runner and pytest-django call before the first test and undo after the last)."""
    from django.test import utils as test_utils

    return hasattr(getattr(test_utils, "_TestState", None), "saved_data")


def clock_shift_allowed(values: dict[str, Any]) -> bool:
    """True when RATELIMIT['CLOCK_SHIFT'] (in `values`) may move the limiter's clock: it is True, and
    DEBUG is on or a test run is under way. Anywhere else (production) it is refused: `check` errors
    (ratelimit.E040) and the clock never moves."""
    return values.get("CLOCK_SHIFT") is True and (bool(getattr(django_settings, "DEBUG", False)) or in_test_run())


class RateLimitSettings:
    """Attribute access to the merged RATELIMIT settings: `ratelimit_settings.FAIL_MODE`."""

    def __init__(self) -> None:
        self._values: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        values, errors = read_settings()
        if errors:
            raise ImproperlyConfigured("\n".join(error.message for error in errors))
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


#: RATELIMIT settings laid over settings.RATELIMIT in this process by the test kit (see `set_overlay`).
_overlay: dict[str, Any] = {}


def set_overlay(values: dict[str, Any]) -> dict[str, Any]:
    """Lay `values` over settings.RATELIMIT in this process, in place of the overlay laid before (`{}`
    removes it), and apply them as a change of RATELIMIT is applied; returns the overlay it replaced.

    For the test kit (ratelimit_app.testing): a test's own key prefix and the permission to move the
    clock stay in force however the test changes RATELIMIT (`override_settings`, pytest-django's
    `settings`), and are gone when the test ends. Names that are no setting raise ValueError; values
    are validated with the rest, when settings are next read."""
    global _overlay
    unknown = sorted(set(values) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"values: {', '.join(unknown)} are not RATELIMIT settings")
    previous, _overlay = _overlay, dict(values)
    _reload_on_change(setting="RATELIMIT")
    return previous


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
        # re-entrant: a garbage collection during a build may run code (a finalizer) that asks for the
        # value again in the same thread; it then builds one of its own rather than waiting forever
        self._lock = threading.RLock()
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
