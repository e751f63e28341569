"""`JointThrottle`: the base of ratelimit_app's DRF throttles (ratelimit_app.throttling), which decide
together: every throttle of ours on one view, and the middleware's per-IP and tier limits when they are
left to the throttles, in ONE all-or-nothing call made when DRF asks the first of them. Also the
exceptions they raise (401, 403, 503)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from django.http import HttpRequest
from rest_framework import throttling as drf_throttling
from rest_framework.exceptions import APIException
from rest_framework.request import Request

from ..core.decision import Decision
from .admission import state_of
from .headers import retry_after_seconds
from .identity import authenticated_user
from .joint import Joint, JointCall, ThrottleHooks, decide_jointly
from .limitcheck import LimitCheck
from .outcome import FORBIDDEN, SHED, UNAUTHORIZED, UNAVAILABLE, LimitOutcome
from .routes import route_for_view
from .shedding import shed_config

#: The request state's entry holding the joint decision of our throttles for a dispatch.
_JOINT_ENTRY = "drf.throttles"


class InvalidApiKey(APIException):
    """401: the request's API key is missing (where one is required), malformed, unknown, revoked or expired."""

    status_code = 401
    default_detail = "A valid API key is required."
    default_code = "invalid_api_key"
    auth_header = 'Bearer realm="api"'


class ClientRefused(APIException):
    """403: a deny rule (ClientRule) refuses the client's network or API key."""

    status_code = 403
    default_detail = "Refused by an access rule."
    default_code = "client_refused"


class LimiterUnavailable(APIException):
    """503: the limiter cannot decide and the fail mode refuses; `wait` becomes `Retry-After`."""

    status_code = 503
    default_detail = "Rate limiter unavailable."
    default_code = "rate_limiter_unavailable"

    def __init__(self, wait: int = 1) -> None:
        super().__init__()
        self.wait = wait


class Overloaded(APIException):
    """503: the load shedder refused the request (too many requests in flight for its priority)."""

    status_code = 503
    default_detail = "Service overloaded: request shed."
    default_code = "overloaded"

    def __init__(self, priority: str) -> None:
        super().__init__(f"Service overloaded: {priority}-priority request shed.")
        self.wait = retry_after_seconds(shed_config().retry_after)


def django_request_of(request: Any) -> HttpRequest:
    """The Django HttpRequest of a DRF Request (or the request itself)."""
    return request._request if isinstance(request, Request) else request


class JointThrottle(ThrottleHooks, drf_throttling.BaseThrottle):
    """Base of our throttles: they decide together (see the module docstring).

    A subclass implements `limit_checks(request, view)`: its checks, [] when it does not limit this
    request, or None when it refuses it outright (a rate of 0).
    """

    #: Read by RateLimitMiddleware (routes.JOINT_THROTTLE_ATTRIBUTE) to leave a view's decision to us.
    decides_with_request_limits: ClassVar[bool] = True
    #: True for the throttle that carries the request's own limits (per-IP and tier).
    carries_request_limits: ClassVar[bool] = False
    decision: Decision | None = None
    outcome: LimitOutcome | None = None

    @property
    def owner(self) -> str:
        """The label of this throttle's checks in the joint decision."""
        return f"throttle:{type(self).__module__}.{type(self).__qualname__}"

    def limit_checks(self, request: Request, view: Any) -> list[LimitCheck] | None:
        raise NotImplementedError(".limit_checks() must be overridden")

    def allow_request(self, request: Request, view: Any) -> bool:
        """Decide (once per request, for all our throttles on the view) and answer for this throttle's
        limits. Raises InvalidApiKey (401) or LimiterUnavailable (503) from the throttle that carries the
        request's own limits."""
        joint = _joint_decision(request, view, self)
        self.outcome = joint.outcome
        if joint.carrier == self.owner:
            _raise_for(joint.outcome)
        refused, self.decision = joint.verdict(self.owner)
        if self.decision is None and not refused:
            return True  # this throttle did not limit this request (like DRF for a None cache key: no hook)
        return self.throttle_failure() if refused else self.throttle_success()

    def wait(self) -> float | None:
        """Seconds until this throttle would allow the request again (None: never, or not refused)."""
        decision = self.decision
        if decision is None or decision.allowed or decision.retry_after is None or math.isinf(decision.retry_after):
            return None
        return max(decision.retry_after, 1.0)


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
    """The decision over every throttle of ours on `view` and the request's own limits, made on the
    first call of a dispatch and reused by the others."""
    django_request = django_request_of(request)
    state = state_of(django_request)
    joint: Joint | None = state.entry.get(_JOINT_ENTRY)
    if joint is not None and joint.handler is view:
        return joint
    throttles = _our_throttles(view, caller)
    deferred = state.take_deferred()
    route = route_for_view(type(view))
    if deferred is not None:
        cost, scope = deferred
    else:
        cost, scope = route.cost_for(request.method), getattr(view, "throttle_scope", None) or route.scope
    # The request's own limits are decided here when a TierRateThrottle asks for them, or when the
    # middleware left them to us; the carrier answers for them.
    with_request_limits = any(t.carries_request_limits for t in throttles) or deferred is not None
    call = JointCall(django_request, view, throttles, lambda throttle: throttle.limit_checks(request, view),
                     cost, scope if isinstance(scope, str) else "", authenticated_user(request), with_request_limits)
    joint = decide_jointly(call, where=f"throttles of {type(view).__qualname__}")
    state.entry[_JOINT_ENTRY] = joint
    return joint


def _our_throttles(view: Any, caller: JointThrottle) -> list[JointThrottle]:
    """Our throttles on `view`, in DRF's order, `caller` standing for its own class."""
    get_throttles = getattr(view, "get_throttles", None)
    found = [t for t in get_throttles() if isinstance(t, JointThrottle)] if callable(get_throttles) else []
    throttles = [caller if type(t) is type(caller) else t for t in found]
    return throttles if caller in throttles else [caller]
