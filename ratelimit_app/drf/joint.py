"""`JointThrottle`, the base of our DRF throttles (ratelimit_app.throttling): every throttle of ours on
one view is admitted in one call when DRF asks the first of them (ratelimit_app.apply.joint)."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest
from rest_framework import throttling as drf_throttling
from rest_framework.request import Request

from ..apply import usage as usage_limits
from ..apply.admission import settings_of
from ..apply.headers import retry_after_seconds
from ..apply.identity import authenticated_user
from ..apply.joint import Joint, ThrottleHooks, decide_jointly, joint_of, request_charge, retry_wait
from ..apply.limitcheck import LimitCheck
from ..apply.outcome import FORBIDDEN, SHED, UNAUTHORIZED, UNAVAILABLE, LimitOutcome
from ..apply.routes import ResolvedView, register_view_finder
from ..core.decision import Decision
from ..core.engine import Usage
from .exceptions import BadEstimate, ClientRefused, InvalidApiKey, LimiterUnavailable, Overloaded


def django_request_of(request: Any) -> HttpRequest:
    """The Django HttpRequest of a DRF Request (or the request itself)."""
    return request._request if isinstance(request, Request) else request


class JointThrottle(ThrottleHooks, drf_throttling.BaseThrottle):
    """Base of our throttles. A subclass implements `limit_checks(request, view)`: its checks, [] when it
    does not limit this request, or None when it refuses it outright (a rate of 0)."""

    decision: Decision | None = None
    outcome: LimitOutcome | None = None

    @property
    def owner(self) -> str:
        return f"throttle:{type(self).__module__}.{type(self).__qualname__}"

    def limit_checks(self, request: Request, view: Any) -> list[LimitCheck] | None:
        raise NotImplementedError(".limit_checks() must be overridden")

    def allow_request(self, request: Request, view: Any) -> bool:
        """Answer for this throttle's limits; the carrier raises the exception of a refusal other than over
        a rate (ratelimit_app.drf.exceptions: 401, 403, 503)."""
        joint = _joint_decision(request, view, self)
        self.outcome = joint.outcome
        if joint.carrier == self.owner:
            _raise_for(joint.outcome)
        refused, self.decision = joint.verdict(self.owner)
        if self.decision is None and not refused:
            return True  # this throttle did not limit this request (like DRF for a None cache key: no hook)
        return self.throttle_failure() if refused else self.throttle_success()

    def wait(self) -> float | None:
        return retry_wait(self.decision, 1.0)


def _raise_for(outcome: LimitOutcome) -> None:
    """The DRF exception answering an outcome refused other than over a rate (401, 403, 503)."""
    if outcome.status == FORBIDDEN:
        raise ClientRefused(outcome.message)
    if outcome.status == UNAUTHORIZED:
        raise InvalidApiKey(outcome.message)
    if outcome.status == SHED:
        raise Overloaded(outcome.message)
    if outcome.status == UNAVAILABLE:
        retry_after = outcome.decision.retry_after if outcome.decision is not None else None
        raise LimiterUnavailable(retry_after_seconds(retry_after))


def _joint_decision(request: Request, view: Any, caller: JointThrottle) -> Joint:
    """The decision over every throttle of ours on `view` and the request's own limits (when a
    TierRateThrottle asks for them, or the middleware left them to us), made on the first call of a
    dispatch and reused by the others."""
    django_request = django_request_of(request)
    joint = joint_of(django_request, view)
    if joint is not None:
        return joint
    throttles = _our_throttles(view, caller)
    cost, scope, deferred = request_charge(django_request, type(view))
    if not deferred:
        scope = getattr(view, "throttle_scope", None) or scope
    request_limits = deferred or any(t.carries_request_limits for t in throttles)
    return decide_jointly(django_request, view, throttles, lambda throttle: throttle.limit_checks(request, view),
                          cost=cost, scope=scope if isinstance(scope, str) else "", user=authenticated_user(request),
                          request_limits=request_limits, usage=_usage_of(request, view) if request_limits else (),
                          where=f"throttles of {type(view).__qualname__}")


def _usage_of(request: Request, view: Any) -> Usage:
    """The usage `view` estimates (`@usage`); BadEstimate (400) when the estimate cannot be made."""
    estimators = usage_limits.estimators_of(view)
    if estimators is None or not settings_of(django_request_of(request)).enabled:
        return ()
    estimated = usage_limits.estimate(request, estimators)  # (a DRF Request: the estimator may read .data)
    if isinstance(estimated, tuple):
        return estimated
    raise BadEstimate(json.loads(estimated.content)["detail"])


def _our_throttles(view: Any, caller: JointThrottle) -> list[JointThrottle]:
    """Our throttles on `view`, in DRF's order, `caller` standing for its own class."""
    get_throttles = getattr(view, "get_throttles", None)
    found = [t for t in get_throttles() if isinstance(t, JointThrottle)] if callable(get_throttles) else []
    throttles = [caller if type(t) is type(caller) else t for t in found]
    return throttles if caller in throttles else [caller]


def _find_view(view_func: Any, request: HttpRequest) -> ResolvedView | None:
    """The ViewFinder of DRF views: a view with a throttle of ours is deferred to them (they decide the
    request's own limits after DRF's authentication, with theirs)."""
    view_class = getattr(view_func, "cls", None)
    throttles = getattr(view_class, "throttle_classes", None) or ()
    if any(isinstance(t, type) and issubclass(t, JointThrottle) for t in throttles):
        return ResolvedView(view_func, True)
    return None  # not a DRF view, or one RateLimitMiddleware decides itself


register_view_finder(_find_view)
