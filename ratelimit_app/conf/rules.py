"""The rules settings.py validates and reads RATELIMIT by: what each setting accepts (`RULES`) and the
cautious reading of an invalid value at run time (`READINGS`)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from ..core.engine import CONNECTION_MODES
from ..core.keys import PREFIX_PATTERN
from ..core.policies import ALGORITHMS, MAX_LIMIT, MAX_PERIOD_SECONDS
from .paths import PathPrefixes, prefix_form
from .redisurl import SCHEMES, url_problem

#: The values of RATELIMIT['BACKEND'] (docs/testing.md tells when "memory" fits).
BACKENDS = ("redis", "memory")

#: Settings whose value can hold a secret (a password in REDIS_URL, the metrics token, the gateways'
#: secret): no check message, log line or exception ever shows their value.
SECRET_SETTINGS = frozenset({"REDIS_URL", "METRICS_TOKEN", "GATEWAY_SECRET"})

#: The longest CACHE_TTL: while the limiter's Redis does not answer, a change saved in the admin (a revoked
#: key) reaches every app server within it.
MAX_CACHE_TTL = 3600
#: The widest trusted proxy or metrics network: a wider one would take in clients of the whole internet.
MIN_PREFIX_LENGTH = {4: 8, 6: 16}
#: Headers that cannot carry the API key: Authorization (whose "Bearer <key>" form is always read) and
#: headers that browsers, proxies or Django themselves set.
_RESERVED_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "host", "content-type",
                               "content-length", "x-forwarded-for", "forwarded", "x-real-ip"})
_TIER_SLUG = re.compile(r"[-a-zA-Z0-9_]+")  # what Tier.slug (a SlugField) accepts
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,100}")
_TOKEN = re.compile(r"[\x21-\x7e]{16,}")  # printable ASCII, no spaces: it travels in a header


def integer(value: Any, low: int, high: int | None = None) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high))


def number(value: Any, low: float = 0.0, high: float | None = None) -> bool:
    """A number above `low` (and at most `high`)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value > low
            and (high is None or value <= high))


def path_prefixes(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(item, str) and item.startswith("/") for item in value)


def _network(text: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """`text` as a network, or None when it is not one or is too wide (MIN_PREFIX_LENGTH)."""
    try:
        network = ipaddress.ip_network(text.strip(), strict=False)
    except (AttributeError, TypeError, ValueError):
        return None
    return network if network.prefixlen >= MIN_PREFIX_LENGTH[network.version] else None


def _narrow_networks(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(_network(item) is not None for item in value)


def _redis_url(value: Any) -> bool:
    return value is None or (isinstance(value, str) and url_problem(value) is None)


def _key_header(value: Any) -> bool:
    return isinstance(value, str) and bool(_HEADER_NAME.fullmatch(value)) and value.lower() not in _RESERVED_HEADERS


_NUMBER = (number, "a number of seconds > 0")
_COUNT = (lambda value: integer(value, 1), "an integer >= 1")
_BOOLEAN = (lambda value: isinstance(value, bool), "True or False")
_TIER = (lambda value: value is None or (isinstance(value, str) and bool(_TIER_SLUG.fullmatch(value))),
         "None or the slug of a tier (letters, digits, '-' or '_'), such as 'free'")
_OPTIONAL_LIMIT = (lambda value: value is None or integer(value, 1, MAX_LIMIT),
                   f"None or an integer from 1 to {MAX_LIMIT}")
_FRACTION = (lambda value: number(value, 0, 1), "a fraction of SHED_CAPACITY above 0 and at most 1")
_PRIORITIES = ("critical", "normal", "low")
_WIDEST = "none wider than /8 (IPv4) or /16 (IPv6)"
_SECRET = (lambda value: value is None or (isinstance(value, str) and bool(_TOKEN.fullmatch(value))),
           "None or a secret of at least 16 characters without spaces, such as the output of "
           "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")

#: For each setting except IP_RATE (settings.py parses it as the middleware does): a test of the value, and
#: what is accepted (and, where a value of the right type would still do harm, why).
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "BACKEND": (lambda value: value in BACKENDS, f"one of {', '.join(map(repr, BACKENDS))}"),
    "REDIS_URL": (_redis_url, f"None or a URL with scheme {', '.join(SCHEMES)}"),
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
    "PATH_PREFIXES": (path_prefixes, "a list of path prefixes, each starting with '/', such as ['/api/']"),
    "EXEMPT_PATHS": (path_prefixes, "a list of path prefixes, each starting with '/', such as ['/health']"),
    "IP_ALGORITHM": (lambda value: value in ALGORITHMS, f"one of {', '.join(map(repr, ALGORITHMS))}"),
    "IP_SHADOW": _BOOLEAN,
    "DEFAULT_USER_TIER": _TIER,
    "REQUIRE_API_KEY": (lambda value: isinstance(value, bool),
                        "True (a request with neither a key of ours nor a signed-in user is refused 401) or "
                        "False (it is limited per client IP, or by ANONYMOUS_TIER)"),
    "ANONYMOUS_TIER": _TIER,
    "HEADERS": (lambda value: value in ("legacy", "ietf", "both"), "one of 'legacy', 'ietf', 'both'"),
    "HEADER_DRAFT": (lambda value: value in ("draft-11",), "'draft-11' (the only revision supported)"),
    "USAGE_HEADERS": _BOOLEAN,
    "ERROR_FORMAT": (lambda value: value in ("json", "problem"), "one of 'json', 'problem'"),
    "NINJA_ERROR_FORMAT": (lambda value: value in ("ninja", "ratelimit"), "one of 'ninja', 'ratelimit'"),
    "TRUSTED_PROXIES": (lambda value: integer(value, 0) or _narrow_networks(value),
                        f"a hop count >= 0 or a list of proxy CIDRs such as ['10.0.0.0/8', '2001:db8::/32'], "
                        f"{_WIDEST}: clients could choose their IP if every address were a trusted proxy"),
    "IPV6_PREFIX": (lambda value: integer(value, 32, 128),
                    "an integer from 32 to 128: a shorter prefix would put whole providers' networks in one limit"),
    "API_KEY_HEADER": (_key_header, "an HTTP header name of letters, digits and '-', such as 'X-API-Key', and "
                                    "not a reserved one (Authorization: its 'Bearer <key>' form is always read; "
                                    "Cookie, Host, Content-Type, Content-Length, X-Forwarded-For, Forwarded)"),
    "CACHE_TTL": (lambda value: number(value, 0, MAX_CACHE_TTL),
                  f"a number of seconds > 0 and at most {MAX_CACHE_TTL}: while the limiter's Redis does not "
                  "answer, the longest a change saved in the admin (a revoked key) takes to reach every app server"),
    "LOCAL_CACHE_SIZE": _COUNT,
    "NEGATIVE_CACHE_SIZE": _COUNT,
    "FAIL_MODE": (lambda value: value in ("open", "closed", "local"), "one of 'open', 'closed', 'local'"),
    "BUDGET_MS": (lambda value: number(value) and value >= 1,
                  "a number of milliseconds >= 1, such as 50 (milliseconds, where the SOCKET_* timeouts are "
                  "seconds): no Redis reply arrives within less, so every decision would follow the fail mode"),
    "APP_SERVERS": _COUNT,
    "BREAKER_FAILURES": _COUNT,
    "BREAKER_COOLDOWN": _NUMBER,
    "BREAKER_MAX_COOLDOWN": _NUMBER,
    "DENY_CACHE_SIZE": _COUNT,
    "METRICS_ENABLED": _BOOLEAN,
    "METRICS_FLUSH_INTERVAL": _NUMBER,
    "METRICS_TTL_HOURS": _COUNT,
    "TOP_BLOCKED": _COUNT,
    "METRICS_TOKEN": _SECRET,
    "METRICS_ALLOWED_IPS": (_narrow_networks, f"a list of CIDRs or addresses such as ['10.0.0.0/8', '127.0.0.1'], "
                                              f"{_WIDEST}: a wider one would open GET /metrics to the internet"),
    "GATEWAY_SECRET": _SECRET,
    "GATEWAY_FIRST_LEASE": (lambda value: value is None or number(value, 0.0999, 3600),
                            "None or seconds from 0.1 to 3600: how long a request's slots are held until the service "
                            "confirms it has the request (an abort holds them that long)"),
    "GATEWAY_NETWORKS": (_narrow_networks, f"a list of the gateways' CIDRs or addresses such as ['10.0.0.5', "
                                           f"'10.1.0.0/24'], {_WIDEST}: a wider one would let the internet "
                                           "describe requests to the gateway endpoint"),
    "SHED_CAPACITY": _OPTIONAL_LIMIT,
    "SHED_LOW_AT": _FRACTION,
    "SHED_NORMAL_AT": _FRACTION,
    "SHED_LEASE": (lambda value: number(value, 0.000999, MAX_PERIOD_SECONDS),
                   f"seconds from 0.001 to {MAX_PERIOD_SECONDS}"),
    "SHED_PRIORITIES": (lambda value: isinstance(value, dict) and all(
                            isinstance(prefix, str) and prefix.startswith("/") and priority in _PRIORITIES
                            for prefix, priority in value.items()),
                        "a dict of path prefixes ('/api/reports/') to 'critical', 'normal' or 'low'"),
    "SHED_PROCESS_LIMIT": _OPTIONAL_LIMIT,
    "SHED_RETRY_AFTER": (lambda value: integer(value, 1, 86400), "whole seconds from 1 to 86400"),
    "CLOCK_SHIFT": _BOOLEAN,
}


def shown(name: str, value: Any) -> str:
    """`value` as a message may show it: never the value of a secret setting."""
    if name in SECRET_SETTINGS:
        return f"RATELIMIT['{name}'] is invalid (its value is not shown: it can hold a secret)"
    return f"RATELIMIT['{name}'] is {value!r}"


def exempting_everything(values: dict[str, Any]) -> str | None:
    """An EXEMPT_PATHS entry under which a whole PATH_PREFIXES entry lies, or None."""
    if not (path_prefixes(values["PATH_PREFIXES"]) and path_prefixes(values["EXEMPT_PATHS"])):
        return None
    for prefix in values["PATH_PREFIXES"]:
        for exempt in values["EXEMPT_PATHS"]:
            if PathPrefixes.of([exempt]).match(prefix_form(prefix)):
                return (f"RATELIMIT['EXEMPT_PATHS'] entry {exempt!r} exempts every path under "
                        f"RATELIMIT['PATH_PREFIXES'] entry {prefix!r}: the middleware would limit nothing there; "
                        "expected paths inside the limited ones, such as ['/api/health']")
    return None


# -- invalid settings at run time: the most cautious reading of what was written -----------------

class _Unreadable:
    def __repr__(self) -> str:
        return "UNREADABLE"


#: The reading of a setting that has none: reading it raises InvalidSetting.
UNREADABLE: Any = _Unreadable()


def _choice(choices: tuple[str, ...], otherwise: Any = UNREADABLE) -> Callable[[Any, dict[str, Any]], Any]:
    """Read a choice written in another case or with spaces around it as that choice, else `otherwise`."""
    def read(value: Any, values: dict[str, Any]) -> Any:
        spelled = value.strip().lower() if isinstance(value, str) else None
        return spelled if spelled in choices else otherwise
    return read


def _items(value: Any) -> list[Any] | None:
    """A list, tuple or lone string as a list of items; None for anything else."""
    return [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None


def _read_prefixes(value: Any, values: dict[str, Any]) -> Any:
    """Every string of PATH_PREFIXES, with its missing leading '/' (limiting more, never less)."""
    items = _items(value)
    if items is None:
        return UNREADABLE
    return [item if item.startswith("/") else f"/{item}" for item in items if isinstance(item, str)]


def _read_exempt(value: Any, values: dict[str, Any]) -> list[str]:
    """The EXEMPT_PATHS entries that are paths and exempt part of a limited prefix, not all of it."""
    prefixes = values["PATH_PREFIXES"] if values["PATH_PREFIXES"] is not UNREADABLE else ["/"]
    return [item for item in _items(value) or () if isinstance(item, str) and item.startswith("/")
            and not any(PathPrefixes.of([item]).match(prefix_form(prefix)) for prefix in prefixes)]


def _read_networks(value: Any, values: dict[str, Any]) -> list[str]:
    """The valid, narrow enough networks of a list or lone string (fewer readers, fewer trusted proxies)."""
    return [item for item in _items(value) or () if _network(item) is not None]


def _read_proxies(value: Any, values: dict[str, Any]) -> Any:
    """TRUSTED_PROXIES: a hop count as written, else its networks as `_read_networks` keeps them."""
    if integer(value, 0):
        return value
    return UNREADABLE if _items(value) is None else _read_networks(value, values)


def _read_switch(value: Any, values: dict[str, Any]) -> Any:
    """A boolean as written, or as a string or number spells it ('true', 'False', 1, 0: an environment
    variable read as is)."""
    if isinstance(value, bool):
        return value
    spelled = value.strip().lower() if isinstance(value, str) else value if value in (0, 1) else None
    return {"true": True, "1": True, 1: True, "false": False, "0": False, 0: False}.get(spelled, UNREADABLE)


def _clamp(bound: str, side: Callable[[Any, Any], Any]) -> Callable[[Any, dict[str, Any]], Any]:
    """Read a number on the wrong side of the setting `bound` as that setting's value (`side`: max or min)."""
    def read(value: Any, values: dict[str, Any]) -> Any:
        limit = values[bound]
        return side(value, limit) if number(value) and number(limit) else UNREADABLE
    return read


#: The cautious reading of each invalid setting that has one, given the settings (read as far as they
#: come before it in DEFAULTS order). Any other invalid setting is unreadable.
READINGS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "BACKEND": _choice(BACKENDS),
    "CONNECTIONS": _choice(CONNECTION_MODES),
    "ENABLED": lambda value, values: True,  # the limiter stays on
    "PATH_PREFIXES": _read_prefixes,
    "EXEMPT_PATHS": _read_exempt,
    "IP_ALGORITHM": _choice(ALGORITHMS),
    "IP_SHADOW": lambda value, values: False,  # the per-IP limit stays enforced
    "REQUIRE_API_KEY": _read_switch,
    "HEADERS": _choice(("legacy", "ietf", "both"), "both"),
    "HEADER_DRAFT": _choice(("draft-11",), "draft-11"),
    "USAGE_HEADERS": lambda value, values: False,  # the standard headers still say where the client stands
    "ERROR_FORMAT": _choice(("json", "problem"), "json"),  # a refusal must be answered in some format
    "NINJA_ERROR_FORMAT": _choice(("ninja", "ratelimit"), "ninja"),
    "TRUSTED_PROXIES": _read_proxies,
    "CACHE_TTL": lambda value, values: min(value, MAX_CACHE_TTL) if number(value) else UNREADABLE,
    "FAIL_MODE": _choice(("open", "closed", "local"), "closed"),
    "BREAKER_MAX_COOLDOWN": _clamp("BREAKER_COOLDOWN", max),
    "METRICS_ALLOWED_IPS": _read_networks,
    "GATEWAY_NETWORKS": _read_networks,  # fewer networks: fewer callers of the gateway endpoint
    "GATEWAY_FIRST_LEASE": lambda value, values: None,  # a gateway's request holds its slots their full lease
    "SHED_LOW_AT": _clamp("SHED_NORMAL_AT", min),  # low-priority requests shed no later than normal ones
    "CLOCK_SHIFT": lambda value, values: False,  # the limiter's clock never moves
}


