"""`manage.py check` for the gateway endpoint when the URLconf routes it: W003, the middleware limits the
endpoint's own path; E006, no guard is set, so it answers no one."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.urls import NoReverseMatch, reverse

from ..conf.paths import PathPrefixes, limited
from ..conf.settings import read_settings

MIDDLEWARE = "ratelimit_app.middleware.RateLimitMiddleware"
_URL_NAMES = ("ratelimit-gateway-authorize", "ratelimit-gateway-auth-request", "ratelimit-gateway-confirm",
              "ratelimit-gateway-release")


def routed_paths() -> list[str]:
    """The paths the URLconf serves the endpoint at (none when it does not include it)."""
    paths = []
    for name in _URL_NAMES:
        try:
            paths.append(reverse(name))
        except NoReverseMatch:
            continue
        except Exception:  # a URLconf that does not import: Django's own URL checks report it
            return []
    return paths


@checks.register("ratelimit", checks.Tags.urls, checks.Tags.security)
def check_gateway_guard(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ratelimit.E006 when the endpoint is routed with neither guard set (an invalid one is E001)."""
    values, errors = read_settings()
    if errors or values["GATEWAY_SECRET"] is not None or values["GATEWAY_NETWORKS"]:
        return []
    paths = routed_paths()
    if not paths:
        return []
    return [checks.Error(
        f"The URLconf routes the gateway endpoint ({', '.join(paths)}) but neither RATELIMIT['GATEWAY_SECRET'] nor "
        "RATELIMIT['GATEWAY_NETWORKS'] is set: it refuses every call (403), since it cannot tell a gateway from "
        "anyone else who reaches Django.",
        hint="Set RATELIMIT['GATEWAY_SECRET'] (the gateways send it in X-RateLimit-Gateway-Secret) and/or "
             "RATELIMIT['GATEWAY_NETWORKS'] (the gateways' addresses); docs/gateway.md shows both.",
        id="ratelimit.E006",
    )]


@checks.register("ratelimit", checks.Tags.urls)
def check_gateway_paths(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ratelimit.W003 when the middleware would limit the endpoint itself."""
    values, errors = read_settings()
    if errors or MIDDLEWARE not in getattr(django_settings, "MIDDLEWARE", ()) or not values["ENABLED"]:
        return []
    prefixes, exempt = PathPrefixes.of(values["PATH_PREFIXES"]), PathPrefixes.of(values["EXEMPT_PATHS"])
    charged = [path for path in routed_paths() if limited(path, prefixes, exempt)]
    if not charged:
        return []
    return [checks.Warning(
        f"RateLimitMiddleware limits the gateway endpoint itself ({', '.join(charged)} under "
        f"RATELIMIT['PATH_PREFIXES']): each authorization request would be charged as a request of the gateway's own.",
        hint="Include ratelimit_app.gateway outside RATELIMIT['PATH_PREFIXES'], or add its path to "
             "RATELIMIT['EXEMPT_PATHS'].",
        id="ratelimit.W003",
    )]
