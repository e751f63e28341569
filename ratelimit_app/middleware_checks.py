"""`manage.py check` for RateLimitMiddleware and the path settings (ratelimit.E022, W021, W022: see
docs/settings.md): listed once in MIDDLEWARE, limiting paths the site has, with prefixes written as paths
are matched (ratelimit_app.conf.paths)."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern, RoutePattern
from django.utils.module_loading import import_string

from .conf.paths import PathPrefixes, prefix_form, typo
from .conf.settings import read_settings

_MIDDLEWARE = "ratelimit_app.middleware.RateLimitMiddleware"
_PATH_SETTINGS = ("PATH_PREFIXES", "EXEMPT_PATHS", "SHED_PRIORITIES")
_PATH_HINT = ("Write each prefix as request.path_info shows paths: decoded, starting with '/', without a query "
              "string, whitespace, '//', '.' or '..' segments; it matches that path and the paths below it, by "
              "segment (docs/settings.md).")


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
        "nothing there", hint="Paths are case-sensitive, start with '/' (request.path_info) and match by segment "
                              "('/api/user' is not '/api/users').",
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
    """True when a URL routed by a pattern starting with `literal` can lie under `prefix` (by segment,
    as the middleware matches: ratelimit_app.conf.paths)."""
    return PathPrefixes.of([prefix]).match(literal) or (open_end and prefix_form(prefix).startswith(literal))


@checks.register("ratelimit")
def check_path_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ratelimit.W022 for each prefix of PATH_PREFIXES, EXEMPT_PATHS or SHED_PRIORITIES that looks like a
    typo, and for SHED_PRIORITIES entries that are one prefix written twice with two priorities."""
    values, errors = read_settings()
    if errors:
        return []  # check_settings reports them
    messages: list[checks.CheckMessage] = [
        checks.Warning(f"RATELIMIT[{name!r}] entry {prefix!r} looks like a typo: {why}.", hint=_PATH_HINT,
                       id="ratelimit.W022")
        for name in _PATH_SETTINGS for prefix in values[name] if (why := typo(prefix)) is not None]
    written: dict[str, str] = {}
    for prefix, priority in values["SHED_PRIORITIES"].items():
        other = written.setdefault(prefix_form(prefix), prefix)
        if other != prefix and values["SHED_PRIORITIES"][other] != priority:
            messages.append(checks.Warning(
                f"RATELIMIT['SHED_PRIORITIES'] entries {other!r} and {prefix!r} are one prefix (a trailing slash "
                "changes nothing) with two priorities: the lower one applies.", hint=_PATH_HINT, id="ratelimit.W022"))
    return messages
