"""The DRF throttles backed by the limiter (docs/usage.md, "Django REST framework", is their manual):
`TierRateThrottle` (the request's tier, as RateLimitMiddleware enforces it), `AnonRateThrottle`,
`UserRateThrottle` and `ScopedRateThrottle` (drop-ins for DRF's, atomic in Redis, rates read at request
time), `ConcurrencyThrottle`, and `RateLimitHeadersMixin` for views without the middleware. All of ours on
one view are admitted in one call (ratelimit_app.drf.joint), synchronously: DRF and adrf ask throttles
from a worker thread.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache, partial
from typing import Any, ClassVar, NoReturn

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from rest_framework import throttling as drf_throttling
from rest_framework.request import Request
from rest_framework.settings import api_settings

from .apply.admission import end, finish
from .apply.concurrency import call_later
from .apply.identity import UNKNOWN_IP, authenticated_user, client_ip, identity_config, ip_identity, throttle_ident
from .apply.joint import rate_check, scope_rate
from .apply.limitcheck import LimitCheck
from .core.policies import CONCURRENCY, InvalidPolicy, Policy, parse_rate
from .drf.joint import JointThrottle, django_request_of


class TierRateThrottle(JointThrottle):
    """Enforce the request's tier as RateLimitMiddleware does (the per-IP limit, then the API key's,
    user's or anonymous tier); a view's `throttle_scope` selects the tier's scoped limits."""

    carries_request_limits = True

    def limit_checks(self, request: Request, view: Any) -> list[LimitCheck] | None:
        return []  # its limits are the request's own


def parse_throttle_rate(rate: str) -> tuple[int, int | float]:
    """(requests, seconds) of a DRF rate: ours ("5/10m", "100/hr") or anything DRF's own `parse_rate`
    reads ("<int>/<period starting with s, m, h or d>"). Raises InvalidPolicy otherwise."""
    try:
        return parse_rate(rate)
    except InvalidPolicy:
        num, _, period = str(rate).partition("/")
        try:
            requests = int(num)
        except ValueError:
            requests = -1
        seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(period[:1])
        if requests < 0 or seconds is None:
            raise
        return requests, seconds


@lru_cache(maxsize=1024)
def _parsed_rate(rate: str) -> tuple[int, int | float]:
    return parse_throttle_rate(rate)


class AtomicRateThrottle(JointThrottle, drf_throttling.SimpleRateThrottle):
    """Base of the drop-ins: DRF's SimpleRateThrottle contract, decided atomically in Redis.

    `get_cache_key(request, view)` names what is limited (None: not this request); it is hashed before
    it reaches Redis. `algorithm` is any engine algorithm (default sliding_window: exact, like DRF's).
    """

    algorithm = "sliding_window"

    cache_throttle = "rest_framework.throttling.SimpleRateThrottle"

    def __init__(self) -> None:
        # DRF reads the rate here and a bad one would fail the request with a 500: keep the error for
        # allow_request, where it follows the fail mode (`manage.py check` reports it first: E010).
        self.config_error: ImproperlyConfigured | None = None
        try:
            super().__init__()
        except ImproperlyConfigured as exc:
            self.config_error = exc

    def get_rate(self) -> str | None:
        """The rate of this throttle's scope (a subclass' `THROTTLE_RATES`, else DEFAULT_THROTTLE_RATES read now)."""
        return scope_rate(self, drf_throttling.SimpleRateThrottle, api_settings.DEFAULT_THROTTLE_RATES or {})

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | float | None]:  # type: ignore[override]
        # (DRF's stubs say the period is an int; ours may be fractional: "3/500ms")
        """(requests, seconds) of `rate` ((None, None) for None); ImproperlyConfigured naming the class."""
        if rate is None:
            return (None, None)
        try:
            return parse_throttle_rate(rate)
        except InvalidPolicy as exc:
            raise ImproperlyConfigured(
                f"{type(self).__name__} (scope {getattr(self, 'scope', None)!r}): rate {rate!r} is not a rate "
                f"such as '100/hour', '10/min' or '5/10m' ({exc})"
            ) from None

    def get_ident(self, request: Any) -> str | None:  # type: ignore[override]
        # (DRF's stubs say str; DRF's own get_ident returns None too, when REMOTE_ADDR is missing)
        """The client address: DRF's rule with NUM_PROXIES set; with it None (DRF's default, which would
        trust a spoofable header), RATELIMIT['TRUSTED_PROXIES'] decides. IPv6 grouped by IPV6_PREFIX."""
        if api_settings.NUM_PROXIES is not None:
            return super().get_ident(request)
        return throttle_ident(django_request_of(request))

    def limit_checks(self, request: Request, view: Any) -> list[LimitCheck] | None:
        if self.config_error is not None:
            raise self.config_error
        rate = self.rate
        if rate is None:
            return []
        key = self.get_cache_key(request, view)
        self.key = key
        self.history: list[float] = []
        if key is None:
            return []
        requests, seconds = _parsed_rate(rate)
        return rate_check(self, request, key, f"throttle:{key}", requests, seconds)

    def metrics_label(self) -> str:
        return f"throttle.{self.scope or 'throttle'}"

    def allow_request(self, request: Request, view: Any) -> bool:
        if getattr(self, "rate", None) is None and self.config_error is None:
            return True
        return super().allow_request(request, view)


class AnonRateThrottle(AtomicRateThrottle, drf_throttling.AnonRateThrottle):
    """Limits anonymous clients by address at DEFAULT_THROTTLE_RATES['anon'] (users are not limited)."""


class UserRateThrottle(AtomicRateThrottle, drf_throttling.UserRateThrottle):
    """Limits each user (anonymous clients by address) at DEFAULT_THROTTLE_RATES['user']."""


class ScopedRateThrottle(AtomicRateThrottle, drf_throttling.ScopedRateThrottle):
    """Limits each user (or address) per view scope (`throttle_scope`, any string) at
    DEFAULT_THROTTLE_RATES[scope]; views without a scope are not limited."""

    def allow_request(self, request: Request, view: Any) -> bool:
        # Like DRF: the scope comes from the view, so it is known only now; no scope, no limit.
        if not self._read_scope(view):
            return True
        return super().allow_request(request, view)

    def limit_checks(self, request: Request, view: Any) -> list[LimitCheck] | None:
        if not self._read_scope(view):
            return []
        return super().limit_checks(request, view)

    def _read_scope(self, view: Any) -> bool:
        """Take the view's scope and its rate (a bad rate is kept for allow_request); False: no scope."""
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return False
        self.config_error = None
        try:
            self.rate = self.get_rate()
            self.num_requests, self.duration = self.parse_rate(self.rate)
        except ImproperlyConfigured as exc:
            self.rate, self.config_error = None, exc
        return True


class ConcurrencyThrottle(JointThrottle):
    """At most `slots` requests of one user (anonymous clients: one address) in flight at once in the
    views it throttles; each holds a slot until its response is closed, `lease` seconds at most if its
    worker dies. Refused: 429 with `Retry-After: 1`. Set `slots`, `lease` and `scope` (the policy
    name, and what views sharing it count together) on a subclass; they are checked when the class is
    defined. The slot is given back by RateLimitMiddleware or RateLimitHeadersMixin (one is needed).
    """

    slots: ClassVar[int] = 5
    lease: ClassVar[float] = 60
    scope: ClassVar[str] = "concurrency"
    policy: ClassVar[Policy] = Policy("concurrency", CONCURRENCY, limit=5, period=60)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        try:
            cls.policy = Policy(cls.scope, CONCURRENCY, limit=cls.slots, period=cls.lease)
        except InvalidPolicy as exc:
            raise ImproperlyConfigured(
                f"{cls.__module__}.{cls.__qualname__}: slots {cls.slots!r}, lease {cls.lease!r}, scope {cls.scope!r}: "
                f"{exc}"
            ) from exc

    def limit_checks(self, request: Request, view: Any) -> list[LimitCheck] | None:
        """One slot per user, else per client address (no address: not limited)."""
        user = authenticated_user(request)
        if user is not None:
            ident = f"user:{user.pk}"
        else:
            address = client_ip(django_request_of(request))
            if address == UNKNOWN_IP:
                return []
            ident = ip_identity(address, identity_config().ipv6_prefix)
        return [LimitCheck(f"throttle:{self.scope}:{ident}", (self.policy,), self.owner, ident)]

    def metrics_label(self) -> str:
        return f"throttle.{self.scope}"


class RateLimitHeadersMixin:
    """Add the headers of the throttles' decision to a DRF view's responses, and give back the slots they
    took (and settle the usage they reserved) when the response is closed, or at once when the view raises
    an exception DRF does not answer. Not needed with RateLimitMiddleware installed (it does both)."""

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        return finish(django_request_of(request), response)

    def raise_uncaught_exception(self, exc: Exception) -> NoReturn:
        _end(django_request_of(self.request))  # type: ignore[attr-defined]  # no response will carry the end
        super().raise_uncaught_exception(exc)  # type: ignore[misc]
        raise exc  # (DRF's own raises it: never reached)


def _end(request: HttpRequest) -> None:
    """`end`; on an event loop (adrf answers an async view's exception there), in the releasing thread:
    giving back slots and settling usage ask Redis, which must not block the loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        end(request)
        return
    call_later(partial(end, request))
