"""Settings: one RATELIMIT dict in the Django settings, with a default for every key, validated in one place
(`setting_errors`, by the rules of rules.py) and read lazily; an invalid setting is read the most cautious
way it allows at run time (docs/settings.md, "Invalid settings at run time").
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..core.logs import log_once
from ..core.policies import ALGORITHMS, InvalidPolicy, Policy, parse_rate
from .redisurl import SCHEMES, url_problem
from .rules import READINGS, RULES, SECRET_SETTINGS, UNREADABLE, exempting_everything, number, shown

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
    "REQUIRE_API_KEY": False,  # True: a request with neither a key of ours nor a user is refused (401)
    "ANONYMOUS_TIER": None,  # tier for clients with no key and no user, per IP; None: the per-IP limit alone
    "HEADERS": "both",  # "legacy" (X-RateLimit-*), "ietf" (RateLimit, RateLimit-Policy) or "both"
    "HEADER_DRAFT": "draft-11",  # the draft-ietf-httpapi-ratelimit-headers revision the IETF fields follow
    "USAGE_HEADERS": False,  # True: x-ratelimit-{limit,remaining,reset}-<unit> on responses that reserve usage
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
    # The gateway endpoint (docs/gateway.md): it answers only calls that pass every guard set here
    "GATEWAY_SECRET": None,  # the secret a gateway sends in X-RateLimit-Gateway-Secret
    "GATEWAY_NETWORKS": [],  # CIDRs the direct peer (REMOTE_ADDR, never a forwarded header) must be in
    # seconds /ratelimit/authorize holds a request's slots until the service confirms it (None: the full lease)
    "GATEWAY_FIRST_LEASE": 5,
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

#: How the error for a RATELIMIT that is not a dict begins (every setting is then invalid).
NOT_A_DICT = "RATELIMIT must be a dict"


@dataclass(frozen=True)
class SettingError:
    """One invalid setting (its name in RATELIMIT) and what is wrong and accepted."""

    setting: str
    message: str


class InvalidSetting(ImproperlyConfigured):
    """An invalid setting with no cautious reading was read at run time; names the setting, never its value."""

    def __init__(self, setting: str) -> None:
        super().__init__(f"RATELIMIT['{setting}'] is invalid and cannot be read: `manage.py check` says why")
        self.setting = setting


def ip_rate_problem(rate: str, algorithm: str | None = None) -> str | None:
    """What keeps `rate` (RATELIMIT['IP_RATE'] or a Tier.ip_rate) from being a per-IP limit counted under
    `algorithm` (None: RATELIMIT['IP_ALGORITHM']), or None."""
    if algorithm is None:
        try:
            algorithm = str(ratelimit_settings.IP_ALGORITHM)
        except InvalidSetting:
            algorithm = str(DEFAULTS["IP_ALGORITHM"])
    try:
        # a limit of 0 is refused even where rates may deny everything (DRF's "0/day"): per IP, it would
        # lock every client out, the admin included if its paths are limited
        if parse_rate(rate)[0] < 1:
            raise InvalidPolicy("a per-IP limit of 0 would refuse every client")
        Policy.parse(rate, name=IP_POLICY_NAME, algorithm=algorithm)
    except InvalidPolicy as exc:
        return str(exc)
    return None


def ip_policy(rate: str) -> Policy:
    """The per-IP limit of `rate` ("100/m") under RATELIMIT['IP_ALGORITHM'] and ['IP_SHADOW']; InvalidPolicy
    for a rate `ip_rate_problem` refuses."""
    problem = ip_rate_problem(rate, ratelimit_settings.IP_ALGORITHM)
    if problem is not None:
        raise InvalidPolicy(problem)
    parsed = Policy.parse(rate, name=IP_POLICY_NAME, algorithm=ratelimit_settings.IP_ALGORITHM)
    return dataclasses.replace(parsed, shadow=bool(ratelimit_settings.IP_SHADOW))


def _ip_rate_error(values: dict[str, Any]) -> str | None:
    rate = values["IP_RATE"]
    if rate is None:
        return None
    algorithm = values["IP_ALGORITHM"] if values["IP_ALGORITHM"] in ALGORITHMS else "sliding_window"
    problem = ip_rate_problem(rate, algorithm)
    if problem is None:
        return None
    return (f"RATELIMIT['IP_RATE'] is {rate!r} ({problem}); expected a rate 'LIMIT/PERIOD' with LIMIT >= 1, such "
            "as '100/m', '10/30s', '5000/h' or '1000/d', or None to disable it")


def setting_errors(values: dict[str, Any]) -> list[SettingError]:
    """Every invalid value among `values` (all settings, defaults applied), in DEFAULTS order."""
    errors = [SettingError(name, f"{shown(name, values[name])}; expected {expected}")
              for name, (valid, expected) in RULES.items() if not valid(values[name])]
    url = values["REDIS_URL"]
    if isinstance(url, str) and url_problem(url) is not None:
        errors = [SettingError("REDIS_URL", f"RATELIMIT['REDIS_URL'] is invalid: {url_problem(url)} (the URL is not "
                               "shown: it can hold a password); expected a URL such as redis://host:6379/0 with "
                               f"scheme {', '.join(SCHEMES)}")
                  if error.setting == "REDIS_URL" else error for error in errors]
    for name, problem in (("IP_RATE", _ip_rate_error(values)), ("EXEMPT_PATHS", exempting_everything(values))):
        if problem is not None:
            errors.append(SettingError(name, problem))
    tier = values["ANONYMOUS_TIER"]
    if values["REQUIRE_API_KEY"] is True and tier is not None and RULES["ANONYMOUS_TIER"][0](tier):
        errors.append(SettingError("REQUIRE_API_KEY", (
            f"RATELIMIT['REQUIRE_API_KEY'] is True while RATELIMIT['ANONYMOUS_TIER'] is {tier!r}: "
            "clients with neither key nor user are refused, so that tier would never apply; expected "
            "REQUIRE_API_KEY False (they are served under ANONYMOUS_TIER) or ANONYMOUS_TIER None (they are refused)")))
    alias = values["CACHE_ALIAS"]
    if values["REDIS_URL"] is None and isinstance(alias, str) and alias not in getattr(django_settings, "CACHES", {}):
        # with a REDIS_URL, an alias that is not a cache only means "no shared lookup cache" (see lookups)
        errors.append(SettingError("CACHE_ALIAS", (
            f"RATELIMIT['CACHE_ALIAS'] is {alias!r}, which is not in settings.CACHES; expected the name of a "
            "django-redis cache in settings.CACHES (RATELIMIT['REDIS_URL'] is None), or set REDIS_URL")))
    cooldown, longest = values["BREAKER_COOLDOWN"], values["BREAKER_MAX_COOLDOWN"]
    if number(cooldown) and number(longest) and longest < cooldown:
        errors.append(SettingError("BREAKER_MAX_COOLDOWN", (
            f"RATELIMIT['BREAKER_MAX_COOLDOWN'] is {longest!r}; expected a number of seconds >= "
            f"RATELIMIT['BREAKER_COOLDOWN'] ({cooldown!r})")))
    low, normal = values["SHED_LOW_AT"], values["SHED_NORMAL_AT"]
    if RULES["SHED_LOW_AT"][0](low) and RULES["SHED_NORMAL_AT"][0](normal) and low > normal:
        errors.append(SettingError("SHED_LOW_AT", (
            f"RATELIMIT['SHED_LOW_AT'] is {low!r}, above RATELIMIT['SHED_NORMAL_AT'] ({normal!r}); expected a "
            "fraction <= SHED_NORMAL_AT: low-priority requests must be shed first")))
    order = list(DEFAULTS)
    return sorted(errors, key=lambda error: order.index(error.setting))


def read_settings() -> tuple[dict[str, Any], list[SettingError]]:
    """settings.RATELIMIT merged over DEFAULTS (and the test kit's overlay: `set_overlay`), and its problems."""
    user = getattr(django_settings, "RATELIMIT", {}) or {}
    if not isinstance(user, dict):  # nothing in it can be read: each setting is read as if written None
        return dict.fromkeys(DEFAULTS), [SettingError("RATELIMIT", f"{NOT_A_DICT}, got {type(user).__name__}")]
    unknown = sorted(set(user) - set(DEFAULTS))
    values = {**DEFAULTS, **{name: value for name, value in user.items() if name in DEFAULTS}, **_overlay}
    errors = setting_errors(values)
    if unknown:
        errors.insert(0, SettingError("RATELIMIT", (
            f"RATELIMIT has unknown setting(s) {', '.join(unknown)}; expected only the settings listed in "
            "docs/settings.md")))
    return values, errors


def in_test_run() -> bool:
    """True while Django's test environment is set up (`django.test.utils.setup_test_environment`)."""
    from django.test import utils as test_utils

    return hasattr(getattr(test_utils, "_TestState", None), "saved_data")


def clock_shift_allowed(values: dict[str, Any]) -> bool:
    """True when RATELIMIT['CLOCK_SHIFT'] is True and honoured: with DEBUG or in a test run (else E040)."""
    return values.get("CLOCK_SHIFT") is True and (bool(getattr(django_settings, "DEBUG", False)) or in_test_run())


def runtime_values(values: dict[str, Any], errors: list[SettingError]) -> dict[str, Any]:
    """`values` with each invalid setting replaced by its cautious reading (rules.READINGS) or UNREADABLE,
    said in one log line per process ("ratelimit.invalid_settings"), never with a secret's value."""
    invalid = {error.setting for error in errors}
    if any(error.message.startswith(NOT_A_DICT) for error in errors):
        invalid = set(DEFAULTS)
    read = dict(values)
    for name, value in values.items():  # in DEFAULTS order: a reading sees the readings before it
        if name in invalid:
            read[name] = READINGS[name](value, read) if name in READINGS else UNREADABLE
    named = [name for name in DEFAULTS if name in invalid]
    log_once("ratelimit.invalid_settings", logging.ERROR,
             invalid=" ".join(sorted(invalid)),
             read_as=", ".join(f"{name}={read[name]!r}" for name in named
                               if read[name] is not UNREADABLE and name not in SECRET_SETTINGS),
             unreadable=" ".join(name for name in named if read[name] is UNREADABLE),
             consequence=f"what needs an unreadable setting does not run, and the requests the middleware "
                         f"limits follow the fail mode {read['FAIL_MODE']!r}; manage.py check says why")
    return read


class RateLimitSettings:
    """The settings as read: `ratelimit_settings.FAIL_MODE` (InvalidSetting for one with no reading)."""

    def __init__(self) -> None:
        self._values: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"no RATELIMIT setting named {name!r}")
        value = self.values()[name]
        if value is UNREADABLE:
            raise InvalidSetting(name) from None
        return value

    def values(self) -> dict[str, Any]:
        """Every setting as read (an unreadable one is `rules.UNREADABLE`); read and validated on first use."""
        if self._values is None:
            values, errors = read_settings()
            self._values = runtime_values(values, errors) if errors else values
        return self._values

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
    """Lay `values` over settings.RATELIMIT in this process in place of the previous overlay, which is
    returned (`{}` removes it). For the test kit: a test's own key prefix and clock stay in force however
    the test changes RATELIMIT. Names that are no setting raise ValueError."""
    global _overlay
    unknown = sorted(set(values) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"values: {', '.join(unknown)} are not RATELIMIT settings")
    previous, _overlay = _overlay, dict(values)
    _reload_on_change(setting="RATELIMIT")
    return previous


T = TypeVar("T")


class SettingsCached(Generic[T]):
    """A per-process value built from the settings on first use and again after RATELIMIT changes, so no
    request re-reads them. Thread-safe: concurrent first uses build it once."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._value: T | None = None
        # re-entrant: a garbage collection during a build may run code (a finalizer) that asks for the
        # value again in the same thread; it then builds one of its own rather than waiting forever
        self._lock = threading.RLock()
        on_reload(self.clear)

    def get(self) -> T:
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._build()
                value = self._value
        return value

    def clear(self) -> None:
        with self._lock:
            self._value = None
