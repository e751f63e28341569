"""Our Django Ninja throttles (`TierRateThrottle`, the drop-ins and their base `AtomicRateThrottle`),
admitted together (ratelimit_app.apply.joint).

Ninja makes a throttle once and asks it for every request, from any thread: the joint decision lives in
the request's state, and `wait()` answers this thread's last refusal (Ninja calls it right after
`allow_request` returned False, in the same thread). Ninja asks throttles synchronously, on the event
loop for `async def` operations: the decision is then made there without Django I/O, or in a thread of
its own when it needs some (`_in_sync_code`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from django.core.exceptions import SynchronousOnlyOperation
from django.db import connections
from django.http import HttpRequest
from ninja.conf import settings as ninja_settings
from ninja.operation import Operation
from ninja.throttling import AnonRateThrottle as NinjaAnonRateThrottle
from ninja.throttling import AuthRateThrottle as NinjaAuthRateThrottle
from ninja.throttling import BaseThrottle, SimpleRateThrottle
from ninja.throttling import UserRateThrottle as NinjaUserRateThrottle

from ..apply import usage as usage_limits
from ..apply.admission import settings_of, state_of
from ..apply.identity import throttle_ident
from ..apply.joint import (
    Joint,
    ThrottleHooks,
    decide_jointly,
    joint_of,
    rate_check,
    request_charge,
    retry_wait,
    scope_rate,
)
from ..apply.limitcheck import LimitCheck
from ..apply.outcome import ALLOWED, DENIED, SHED, UNAVAILABLE, LimitOutcome
from ..apply.planning import FROM_REQUEST
from ..apply.routes import ResolvedView, joined_checks, register_view_finder, validate_scope, view_limit_of
from ..apply.shedding import shed_config
from ..core.engine import Usage
from ..plans.lookups import NeedsIO, local_only
from .operations import operation_for, request_operation
from .refusals import BAD_ESTIMATE, answer_refusals

T = TypeVar("T")
_LEAST_WAIT = 0.001  # seconds: Ninja rounds a wait up for Retry-After, which is then at least 1
_answers = threading.local()  # .waits: {id(throttle): seconds to wait or None} of this thread's last answers


def _waits() -> dict[int, float | None]:
    waits: dict[int, float | None] | None = getattr(_answers, "waits", None)
    if waits is None:
        waits = _answers.waits = {}
    return waits


class JointThrottle(ThrottleHooks, BaseThrottle):
    """Base of our Ninja throttles. A subclass implements `limit_checks(request)`: its checks, [] when it
    does not limit this request, or None when it refuses it outright (a rate of 0)."""

    #: The tier scope this throttle asks for (TierRateThrottle's), None: the operation's `@limit_cost` scope.
    tier_scope: str | None = None

    @property
    def owner(self) -> str:  # one per throttle object
        return f"ninja:{type(self).__module__}.{type(self).__qualname__}@{id(self):x}"

    def limit_checks(self, request: HttpRequest) -> list[LimitCheck] | None:
        raise NotImplementedError(".limit_checks() must be overridden")

    def allow_request(self, request: HttpRequest) -> bool:
        """Answer for this throttle's limits; the carrier also refuses a request the request's own limits
        refuse for any reason (401, 403, 503: ratelimit_app.ninja.refusals)."""
        operation = request_operation(request)
        joint = _joint_decision(request, operation, self)
        refused, decision = joint.verdict(self.owner)
        outcome = joint.outcome
        wait = retry_wait(decision, _LEAST_WAIT) if refused else None
        if joint.carrier == self.owner and outcome.status not in (ALLOWED, DENIED):
            refused, wait = True, _wait_for_status(outcome)
        _waits()[id(self)] = wait
        if refused and operation is not None:
            answer_refusals(operation.api)
        if decision is None and not refused:
            return True  # this throttle did not limit this request (like Ninja for a None cache key)
        return self.throttle_failure() if refused else self.throttle_success()

    def wait(self) -> float | None:
        """Seconds until the request it last refused in this thread would be allowed (None: never, or 401, 403)."""
        return _waits().get(id(self))


def _wait_for_status(outcome: LimitOutcome) -> float | None:
    """The wait of a request refused other than over a rate: the limiter's or the shedder's retry time."""
    if outcome.status == UNAVAILABLE:
        return retry_wait(outcome.decision, _LEAST_WAIT) or 1.0
    if outcome.status == SHED:
        return float(shed_config().retry_after)
    return None


def _joint_decision(request: HttpRequest, operation: Operation | None, caller: JointThrottle) -> Joint:
    """The joint decision of the operation's throttles for `request`, made when Ninja asks the first of
    them and reused by the others. A throttle asked outside an operation decides alone."""
    handler = operation if operation is not None else caller
    joint = joint_of(request, handler)
    if joint is not None:
        return joint
    found = [t for t in operation.throttle_objects if isinstance(t, JointThrottle)] if operation is not None else []
    members = found if caller in found else [caller]
    declared = operation.view_func if operation is not None else None
    cost, scope, deferred = request_charge(request, declared)
    scope = next((m.tier_scope for m in members if m.tier_scope), scope)
    request_limits = deferred or any(m.carries_request_limits for m in members)
    view_limit = view_limit_of(declared)
    usage = _usage_of(request, declared) if request_limits else ()
    bad_estimate = usage is None  # every throttle then refuses, nothing asked (answered 400: refusals._answer)
    return decide_jointly(request, handler, members,
                          lambda member: None if bad_estimate else member.limit_checks(request), cost=cost,
                          scope=scope, user=_user_of(request), request_limits=request_limits,
                          extra=lambda: joined_checks(view_limit, request, cost), usage=usage or (),
                          where=f"throttles of {getattr(declared, '__qualname__', type(caller).__qualname__)}",
                          run=_in_sync_code)


def _usage_of(request: HttpRequest, operation_function: Any) -> Usage | None:
    """The usage the operation estimates (`@usage`); None when it cannot (its 400 kept for refusals._answer)."""
    estimators = usage_limits.estimators_of(operation_function)
    if estimators is None or not settings_of(request).enabled:
        return ()
    estimated = usage_limits.estimate(request, estimators)
    if isinstance(estimated, tuple):
        return estimated
    state_of(request).entry[BAD_ESTIMATE] = estimated
    return None


def _in_sync_code(decide_now: Callable[[], T]) -> T:
    """Run the decision `decide_now` where Ninja asks its throttles, maybe on an event loop. On a loop it
    runs right there when it needs no Django I/O (lookups from this process' cache, `local_only`; one Redis
    call bounded by RATELIMIT['BUDGET_MS']); when it needs the database or the shared cache (a cold lookup,
    a session user not read yet), in a thread of its own, the loop waiting, its connections then closed."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return decide_now()
    try:
        with local_only():
            return decide_now()
    except (NeedsIO, SynchronousOnlyOperation):
        return _in_a_thread(decide_now)


def _in_a_thread(decide_now: Callable[[], T]) -> T:
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(decide_now())
        except BaseException as exc:  # handed to the caller, which follows the fail mode
            failure.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name="ratelimit-sync-decision", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def _user_of(request: HttpRequest) -> Any:
    """The user whose tier applies: `request.auth` when Ninja's authentication gave a user, else the
    request's (read when the decision is made)."""
    from django.contrib.auth.base_user import AbstractBaseUser

    auth = request.__dict__.get("auth")
    if isinstance(auth, AbstractBaseUser) and auth.is_authenticated:
        return auth
    return FROM_REQUEST


class TierRateThrottle(JointThrottle):
    """Enforce the client's tier exactly as RateLimitMiddleware does (per-IP limit, then the API key's,
    user's or anonymous tier). `scope` selects the tier's scoped limits (default: the operation's
    `@limit_cost(scope=...)`). ValueError for a scope that is not 1-30 letters, digits, '_' or '-'."""

    carries_request_limits = True

    def __init__(self, scope: str | None = None) -> None:
        if scope is not None:
            try:
                validate_scope(scope)
            except ValueError as exc:
                raise ValueError(f"TierRateThrottle: {exc}") from None
        self.tier_scope = scope

    def limit_checks(self, request: HttpRequest) -> list[LimitCheck] | None:
        return []  # its limits are the request's own


class AtomicRateThrottle(JointThrottle, SimpleRateThrottle):
    """Base of the drop-ins: Ninja's SimpleRateThrottle contract, decided atomically in Redis.

    `AtomicRateThrottle("10/m")`, or a `scope` whose rate is in NINJA_DEFAULT_THROTTLE_RATES (or in a
    `THROTTLE_RATES` class attribute), read when the throttle is made, as Ninja does; the rate formats
    are Ninja's ("100/5m", "100/300s", "100/300", units s, sec, m, min, h, hour, d, day), and a bad one
    raises Ninja's ValueError. `get_cache_key(request)` names what is limited (None: not this request);
    it is hashed before it reaches Redis, together with the rate, so two throttles with different rates
    never share a count. A rate of None limits nothing; a rate of 0 refuses every request.
    `algorithm` is any engine algorithm (default sliding_window: exact, like Ninja's).
    """

    algorithm: ClassVar[str] = "sliding_window"

    cache_throttle = "ninja.throttling.SimpleRateThrottle"

    def get_rate(self) -> str | None:
        """The rate of this throttle's scope (a subclass' `THROTTLE_RATES`, else NINJA_DEFAULT_THROTTLE_RATES now)."""
        return scope_rate(self, SimpleRateThrottle, ninja_settings.DEFAULT_THROTTLE_RATES)

    def get_ident(self, request: HttpRequest) -> str | None:
        """The client address: Ninja's rule with NINJA_NUM_PROXIES set; with it None (Ninja's default, which
        would trust a spoofable header), RATELIMIT['TRUSTED_PROXIES'] decides. IPv6 grouped by IPV6_PREFIX."""
        if ninja_settings.NUM_PROXIES is not None:
            return super().get_ident(request)
        return throttle_ident(request)

    def allow_request(self, request: HttpRequest) -> bool:
        if self.rate is None:  # limits nothing (Ninja's own would fail the request)
            return True
        return super().allow_request(request)

    def limit_checks(self, request: HttpRequest) -> list[LimitCheck] | None:
        key = self.get_cache_key(request)
        if key is None or self.rate is None or self.num_requests is None or self.duration is None:
            return []
        identity = f"throttle:{key}|{self.num_requests}/{self.duration}"
        return rate_check(self, request, key, identity, self.num_requests, self.duration)

    def metrics_label(self) -> str:
        return f"throttle.{self.scope or 'throttle'}"


class AnonRateThrottle(AtomicRateThrottle, NinjaAnonRateThrottle):
    """Limits anonymous clients (no `request.auth`) by address (scope "anon"); authenticated ones are not limited."""


class AuthRateThrottle(AtomicRateThrottle, NinjaAuthRateThrottle):
    """Limits each `request.auth` (a digest of its `str()`), anonymous clients by address (scope "auth")."""


class UserRateThrottle(AtomicRateThrottle, NinjaUserRateThrottle):
    """Limits each user (`request.user`), anonymous clients by address (scope "user")."""


def _find_view(view_func: Any, request: HttpRequest) -> ResolvedView | None:
    """The ViewFinder of Ninja views: the operation's function (whose declarations RateLimitMiddleware
    reads), deferred when the operation has throttles of ours (they decide the request's own limits)."""
    if getattr(view_func, "__module__", None) != "ninja.operation":
        return None  # not a Ninja view: one attribute read on every request
    operation = operation_for(view_func, request)
    if operation is None:
        return None
    deferred = any(isinstance(t, JointThrottle) for t in operation.throttle_objects)
    return ResolvedView(operation.view_func, deferred)


register_view_finder(_find_view)
