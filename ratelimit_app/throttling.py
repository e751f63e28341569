"""DRF throttles backed by the limiter: the request's tier, and atomic drop-ins for DRF's own throttles.

- `TierRateThrottle` enforces the request's tier exactly as RateLimitMiddleware does (per-IP limit,
  then the key's, user's or anonymous tier; the view's `throttle_scope` selects scoped limits). When the
  middleware already limited the request, it reuses that decision instead of charging twice.
- `AnonRateThrottle`, `UserRateThrottle`, `ScopedRateThrottle` replace DRF's classes of the same names:
  same settings (`DEFAULT_THROTTLE_RATES`, `throttle_scope`), but each decision is one atomic Redis
  call (DRF's read-then-write cache throttle over-admits under concurrency), rates such as "5/10m" are
  accepted, and rates are read at request time, so `override_settings` reaches them.

`wait()` returns the limiter's retry time, so DRF answers 429 with `Retry-After`.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from . import metrics
from .decision import Decision
from .headers import retry_after_seconds
from .identity import authenticated_user, request_ip_identity, user_identity
from .limiting import ALLOWED, LIMITER_ERRORS, UNAUTHORIZED, LimitOutcome, get_config, limit_request
from .middleware import REQUEST_ATTRIBUTE, add_headers
from .policies import InvalidPolicy, Policy
from .routes import route_for_view
from .service import get_limiter


class InvalidApiKey(APIException):
    """401: the request's API key is missing (where one is required), malformed, unknown, revoked or expired."""

    status_code = 401
    default_detail = "A valid API key is required."
    default_code = "invalid_api_key"
    auth_header = 'Bearer realm="api"'


class LimiterUnavailable(APIException):
    """503: the limiter cannot decide and the fail mode refuses; `wait` becomes `Retry-After`."""

    status_code = 503
    default_detail = "Rate limiter unavailable."
    default_code = "rate_limiter_unavailable"

    def __init__(self, wait: int = 1) -> None:
        super().__init__()
        self.wait = wait


def _django_request(request: Any) -> HttpRequest:
    return request._request if isinstance(request, Request) else request


class TierRateThrottle(BaseThrottle):
    """Enforce the request's tier (see the module docstring); a view may set `throttle_scope`."""

    def __init__(self) -> None:
        self.outcome: LimitOutcome | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        """Charge the request to its per-IP limit and tier; raise 401/503 for a bad key / unavailable limiter."""
        django_request = _django_request(request)
        existing: LimitOutcome | None = django_request.__dict__.get(REQUEST_ATTRIBUTE)
        if existing is not None and existing.charged and existing.status == ALLOWED:
            self.outcome = existing  # RateLimitMiddleware already charged this request
            return True
        route = route_for_view(view.__class__)
        scope = getattr(view, "throttle_scope", None) or route.scope
        outcome = limit_request(
            django_request, cost=max(route.cost_for(request.method), 1), scope=scope,
            user=authenticated_user(request),
        )
        setattr(django_request, REQUEST_ATTRIBUTE, outcome)
        self.outcome = outcome
        if outcome.status == UNAUTHORIZED:
            raise InvalidApiKey(outcome.message)
        if outcome.decision is not None and outcome.decision.degraded and not outcome.allowed:
            raise LimiterUnavailable(retry_after_seconds(outcome.decision.retry_after) or 1)
        return outcome.allowed

    def wait(self) -> float | None:
        """Seconds until the same request would be allowed (None when it never will be)."""
        return _wait(self.outcome.decision if self.outcome is not None else None)


def _wait(decision: Decision | None) -> float | None:
    if decision is None or decision.retry_after is None or math.isinf(decision.retry_after):
        return None
    return max(decision.retry_after, 1.0)


class RateLimitHeadersMixin:
    """Add the rate limit headers of TierRateThrottle's decision to a DRF view's responses.

    Not needed when RateLimitMiddleware is installed (it adds them for throttled requests too).
    """

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        outcome = _django_request(request).__dict__.get(REQUEST_ATTRIBUTE)
        if outcome is not None:
            add_headers(response, outcome)
        return response


@lru_cache(maxsize=256)
def _policy(scope: str, rate: str, algorithm: str) -> Policy:
    try:
        return Policy.parse(rate, name=scope, algorithm=algorithm)
    except InvalidPolicy as exc:
        raise ImproperlyConfigured(f"DEFAULT_THROTTLE_RATES['{scope}'] = {rate!r}: {exc}") from exc


class AtomicRateThrottle(BaseThrottle):
    """Base of the drop-ins: `rate` (or DEFAULT_THROTTLE_RATES[scope], read per request) per identity.

    Subclasses implement `get_identity(request, view)`; None means "do not throttle this request".
    `algorithm` is any engine algorithm (default sliding_window, exact).
    """

    scope: str | None = None
    rate: str | None = None
    algorithm = "sliding_window"

    def __init__(self) -> None:
        self.decision: Decision | None = None

    def get_rate(self) -> str | None:
        """The rate for this throttle's scope; ImproperlyConfigured when the scope has none."""
        if self.rate is not None:
            return self.rate
        if not self.scope:
            raise ImproperlyConfigured(f"You must set either `.scope` or `.rate` for '{type(self).__name__}' throttle")
        rates = api_settings.DEFAULT_THROTTLE_RATES or {}
        if self.scope not in rates:
            raise ImproperlyConfigured(f"No default throttle rate set for '{self.scope}' scope")
        rate = rates[self.scope]
        return str(rate) if rate is not None else None

    def get_identity(self, request: Request, view: Any) -> str | None:
        raise NotImplementedError(".get_identity() must be overridden")

    def allow_request(self, request: Request, view: Any) -> bool:
        """Charge one unit to this throttle's limit for the request's identity; False when over it."""
        rate = self.get_rate()
        if rate is None:
            return True
        identity = self.get_identity(request, view)
        if identity is None:
            return True
        scope = self.scope or "throttle"
        policy = _policy(scope, rate, self.algorithm)
        label = f"throttle.{scope}"
        try:
            decision = get_limiter().hit(f"throttle:{identity}", [policy])
        except LIMITER_ERRORS:
            decision = Decision(get_config().fail_mode == "open", 0, 0, 0.0, 1.0, scope, (), degraded=True)
            metrics.record_decision(allowed=decision.allowed, tier=label, policy=None if decision.allowed
                                    else scope, degraded=True, identity=identity)
            if not decision.allowed:
                raise LimiterUnavailable(1) from None
            return True
        self.decision = decision
        metrics.record_decision(allowed=decision.allowed, tier=label,
                                policy=None if decision.allowed else decision.policy,
                                degraded=decision.degraded, identity=identity)
        if decision.degraded and not decision.allowed:
            raise LimiterUnavailable(retry_after_seconds(decision.retry_after) or 1)
        return decision.allowed

    def wait(self) -> float | None:
        """Seconds until this throttle would allow the request again."""
        return _wait(self.decision)


class AnonRateThrottle(AtomicRateThrottle):
    """Limits anonymous clients by IP (trusted proxies only) at DEFAULT_THROTTLE_RATES['anon']."""

    scope = "anon"

    def get_identity(self, request: Request, view: Any) -> str | None:
        if authenticated_user(request) is not None:
            return None
        return request_ip_identity(_django_request(request))


class UserRateThrottle(AtomicRateThrottle):
    """Limits each user (anonymous clients by IP) at DEFAULT_THROTTLE_RATES['user']."""

    scope = "user"

    def get_identity(self, request: Request, view: Any) -> str | None:
        user = authenticated_user(request)
        if user is not None:
            return user_identity(user.pk)
        return request_ip_identity(_django_request(request))


class ScopedRateThrottle(AtomicRateThrottle):
    """Limits each user (or IP) per view scope (`throttle_scope`) at DEFAULT_THROTTLE_RATES[scope]."""

    scope_attr = "throttle_scope"

    def allow_request(self, request: Request, view: Any) -> bool:
        # Like DRF: the scope comes from the view, so it is known only now; no scope, no limit.
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return True
        return super().allow_request(request, view)

    def get_identity(self, request: Request, view: Any) -> str | None:
        user = authenticated_user(request)
        if user is not None:
            return user_identity(user.pk)
        return request_ip_identity(_django_request(request))
