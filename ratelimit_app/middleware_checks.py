"""`manage.py check` for RateLimitMiddleware: listed once in MIDDLEWARE, limiting paths the site has.

- ratelimit.E022: RateLimitMiddleware (or a subclass) is listed more than once (every request would be
  charged twice);
- ratelimit.W021: with the middleware installed, RATELIMIT['PATH_PREFIXES'] is empty, or an entry the
  project wrote matches no URL of the URLconf (paths are case-sensitive): the middleware limits nothing
  there. The default (['/api/']) is not checked against the URLs: a project may add its API later, and a
  request under /api/ is charged even before its view exists.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern, RoutePattern
from django.utils.module_loading import import_string

from .service.conf import read_settings

_MIDDLEWARE = "ratelimit_app.middleware.RateLimitMiddleware"


@checks.register("ratelimit", checks.Tags.urls)
def check_middleware(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """RateLimitMiddleware (or a subclass) is listed at most once, and its PATH_PREFIXES match URLs of
    the URLconf."""
    entries = getattr(django_settings, "MIDDLEWARE", None) or ()
    count = sum(1 for entry in entries if _is_rate_limit_middleware(entry))
    if count > 1:
        return [checks.Error(
            f"{_MIDDLEWARE} is listed {count} times in MIDDLEWARE: every request would be charged twice",
            hint="Keep one entry, after AuthenticationMiddleware.", id="ratelimit.E022")]
    values, errors = read_settings()
    if not count or errors:
        return []  # not installed, or invalid settings (check_settings reports those)
    prefixes = values["PATH_PREFIXES"]
    if not prefixes:
        return [checks.Warning("RATELIMIT['PATH_PREFIXES'] is []: the middleware limits no path",
                               hint="List the prefixes of your API, such as ['/api/'] (or remove the middleware "
                                    "if only decorators and throttles limit).", id="ratelimit.W021")]
    if "PATH_PREFIXES" not in (getattr(django_settings, "RATELIMIT", None) or {}):
        return []  # the default: see the module docstring
    try:
        routes = list(_route_prefixes(get_resolver().url_patterns, "/"))
    except Exception:  # a URLconf that does not import: Django's own URL checks report it
        return []
    return [checks.Warning(
        f"RATELIMIT['PATH_PREFIXES'] entry {prefix!r} matches no URL of the URLconf: the middleware limits "
        "nothing there", hint="Paths are case-sensitive and start with '/' (request.path_info).",
        id="ratelimit.W021")
        for prefix in prefixes if not any(_matches(prefix, literal, open_end) for literal, open_end in routes)]


def _is_rate_limit_middleware(entry: Any) -> bool:
    from .middleware import RateLimitMiddleware

    try:
        cls = import_string(entry) if isinstance(entry, str) else entry
    except ImportError:
        return False  # Django reports a middleware that does not import when it loads it
    return isinstance(cls, type) and issubclass(cls, RateLimitMiddleware)


_REGEX_SPECIAL = re.compile(r"[\\.^$*+?{}\[\]|()]")


def _literal(pattern: Any) -> tuple[str, bool]:
    """The literal start of a URL pattern, and whether anything else may follow it (a converter, a
    regex, a regex not anchored at its end, a language prefix)."""
    matcher = pattern.pattern
    if isinstance(matcher, RoutePattern):
        literal, converter, _ = str(matcher).partition("<")
        return literal, bool(converter)
    if isinstance(matcher, RegexPattern):
        body = str(matcher).removeprefix("^")
        match = _REGEX_SPECIAL.search(body)
        literal = body if match is None else body[:match.start()]
        return literal, match is not None and body[match.start():] != "$"
    return "", True


def _route_prefixes(patterns: Any, base: str) -> Any:
    """(literal path start, open end) of every URL the patterns route, from `base` down."""
    for pattern in patterns:
        literal, open_end = _literal(pattern)
        if isinstance(pattern, URLResolver):
            if open_end:
                yield base + literal, True
            else:
                yield from _route_prefixes(pattern.url_patterns, base + literal)
        elif isinstance(pattern, URLPattern):
            yield base + literal, open_end


def _matches(prefix: str, literal: str, open_end: bool) -> bool:
    """True when a URL routed by a pattern starting with `literal` can start with `prefix`."""
    return literal.startswith(prefix) or (open_end and prefix.startswith(literal))
