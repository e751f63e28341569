"""`manage.py check` for the DRF throttles: rates that parse, scopes with a rate, no override ours ignore,
clients told apart behind proxies, and concurrency slots given back.

RateLimitConfig.ready() imports this module (which registers the check) only when Django REST framework
can be imported, so a project without it never imports it. The check examines the throttles named in
REST_FRAMEWORK['DEFAULT_THROTTLE_CLASSES'] and on the views of the URLconf:

- ratelimit.E010: a REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'] value is not a rate;
- ratelimit.E011: a view with our ScopedRateThrottle has a `throttle_scope` without a rate;
- ratelimit.W010: a subclass of our throttles overrides `timer` or `history`, which ours never use;
- ratelimit.W011: our throttles are in use, REST_FRAMEWORK['NUM_PROXIES'] is None and
  RATELIMIT['TRUSTED_PROXIES'] is not set, so X-Forwarded-For is ignored;
- ratelimit.W012: a view's throttles may take concurrency slots that nothing gives back.
"""

from __future__ import annotations

import contextlib
from typing import Any

from django.core import checks
from django.urls import get_resolver
from rest_framework.settings import api_settings

from .apply.concurrency import middleware_installed
from .apply.identity import identity_config
from .conf.settings import read_settings
from .core.policies import InvalidPolicy
from .drf.joint import JointThrottle
from .throttling import (
    AtomicRateThrottle,
    ConcurrencyThrottle,
    RateLimitHeadersMixin,
    ScopedRateThrottle,
    TierRateThrottle,
    parse_throttle_rate,
)


@checks.register("ratelimit")
def check_throttle_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The checks of the module docstring, over the throttles in use (DEFAULT_THROTTLE_CLASSES and the
    views of the URLconf)."""
    rates = api_settings.DEFAULT_THROTTLE_RATES or {}
    messages = _rate_errors(rates)
    defaults: Any = api_settings.DEFAULT_THROTTLE_CLASSES or ()  # imported classes (the stubs say strings)
    used_throttles: set[type] = {t for t in defaults if isinstance(t, type) and issubclass(t, JointThrottle)}
    with contextlib.suppress(Exception):  # the URLconf's own errors are reported by Django's checks
        for view_class in _drf_view_classes(get_resolver().url_patterns):
            throttles = [t for t in getattr(view_class, "throttle_classes", ()) or () if isinstance(t, type)]
            used_throttles.update(t for t in throttles if issubclass(t, JointThrottle))
            messages += _view_messages(view_class, throttles, rates)
    messages += _override_warnings({t for t in used_throttles if issubclass(t, AtomicRateThrottle)})
    if used_throttles:
        messages += _proxy_warning()  # how our throttles tell clients apart: nothing to say when none is used
    return messages


def _rate_errors(rates: dict[str, Any]) -> list[checks.CheckMessage]:
    """ratelimit.E010 for each rate of DEFAULT_THROTTLE_RATES that does not parse."""
    messages: list[checks.CheckMessage] = []
    for scope, rate in rates.items():
        if rate is None:
            continue
        try:
            parse_throttle_rate(str(rate))
        except InvalidPolicy as exc:
            messages.append(checks.Error(
                f"REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'][{scope!r}] = {rate!r} is not a rate: {exc}",
                hint="Use '<requests>/<period>': '100/hour', '10/min', '5/10m', '0/day' (refuse all) or None.",
                id="ratelimit.E010",
            ))
    return messages


def _view_messages(view_class: type, throttles: list[type], rates: dict[str, Any]) -> list[checks.CheckMessage]:
    """ratelimit.W012 (slots nobody gives back) and E011 (a scope without a rate) for one view class."""
    messages: list[checks.CheckMessage] = []
    name = f"{view_class.__module__}.{view_class.__qualname__}"
    takes_slots = [t for t in throttles if issubclass(t, (ConcurrencyThrottle, TierRateThrottle))]
    if takes_slots and not middleware_installed() and not issubclass(view_class, RateLimitHeadersMixin):
        messages.append(checks.Warning(
            f"{name} uses {takes_slots[0].__name__}, which may take concurrency slots, but neither "
            "RateLimitMiddleware nor RateLimitHeadersMixin gives them back: each slot would be held until its "
            "lease runs out.",
            hint="Add ratelimit_app.middleware.RateLimitMiddleware to MIDDLEWARE, or RateLimitHeadersMixin to "
                 "the view.", id="ratelimit.W012",
        ))
    view_scope = getattr(view_class, "throttle_scope", None)
    scoped = [t for t in throttles if issubclass(t, ScopedRateThrottle) and "THROTTLE_RATES" not in vars(t)]
    if view_scope and scoped and view_scope not in rates:
        messages.append(checks.Error(
            f"{name}.throttle_scope = {view_scope!r} has no rate in REST_FRAMEWORK['DEFAULT_THROTTLE_RATES']",
            hint=f"Add DEFAULT_THROTTLE_RATES[{view_scope!r}] (None: not limited).", id="ratelimit.E011",
        ))
    return messages


def _override_warnings(used_throttles: set[type]) -> list[checks.CheckMessage]:
    """ratelimit.W010 for each throttle in use that overrides `timer` or `history`."""
    messages: list[checks.CheckMessage] = []
    for throttle in sorted(used_throttles, key=lambda t: f"{t.__module__}.{t.__qualname__}"):
        ignored = [name for name in ("timer", "history") if any(name in vars(k) for k in _own_classes(throttle))]
        if ignored:
            messages.append(checks.Warning(
                f"{throttle.__module__}.{throttle.__qualname__} overrides {', '.join(ignored)}, which "
                "ratelimit_app throttles never use: time comes from Redis TIME and the history lives in Redis.",
                hint="Remove the override; see the compatibility table in docs/usage.md.", id="ratelimit.W010",
            ))
    return messages


def _proxy_warning() -> list[checks.CheckMessage]:
    """ratelimit.W011 when neither DRF's NUM_PROXIES nor RATELIMIT['TRUSTED_PROXIES'] is set."""
    if read_settings()[1]:
        return []  # invalid RATELIMIT settings: ratelimit.E001 says which
    config = identity_config()
    if api_settings.NUM_PROXIES is not None or config.trusted_hops or config.trusted_networks:
        return []
    return [checks.Warning(
        "X-Forwarded-For is ignored by ratelimit_app's throttles: REST_FRAMEWORK['NUM_PROXIES'] is None "
        "(DRF would trust the spoofable header) and RATELIMIT['TRUSTED_PROXIES'] is not set.",
        hint="Behind a proxy, set REST_FRAMEWORK['NUM_PROXIES'] or RATELIMIT['TRUSTED_PROXIES'] so clients "
             "are told apart; otherwise every client counts as the proxy's address. Silence this warning "
             "with SILENCED_SYSTEM_CHECKS = ['ratelimit.W011'] when no proxy is in front.",
        id="ratelimit.W011",
    )]


def _own_classes(throttle: type) -> list[type]:
    """The classes of `throttle`'s MRO written by the project (below our AtomicRateThrottle)."""
    return [k for k in throttle.__mro__ if issubclass(k, AtomicRateThrottle) and k.__module__ != __name__]


def _drf_view_classes(patterns: Any) -> Any:
    """The view classes of every URL pattern, included ones too."""
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            yield from _drf_view_classes(pattern.url_patterns)
        else:
            view_class = getattr(getattr(pattern, "callback", None), "cls", None)
            if isinstance(view_class, type):
                yield view_class
