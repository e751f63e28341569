"""The joint decision of several throttles of ours on one handler (a DRF view, a Ninja operation):
their checks, the handler's own limit (`@ratelimit`) and the request's own limits (per-IP and tier) when
they are decided there, in ONE all-or-nothing call made when the framework asks the first of them; then
what each throttle answers for (`Joint.verdict`). Framework-free: which throttles sit on a handler and
how each names its checks is the framework's part (ratelimit_app.drf, ratelimit_app.ninja).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from ..core.decision import Decision
from ..core.engine import Usage
from ..core.policies import Policy
from . import usage as usage_limits
from .admission import hold_usage, record, state_if_any, state_of
from .identity import authenticated_user
from .limitcheck import REQUEST_LIMITS, LimitCheck, identity_digest
from .limiting import decide, limit_config, limit_request, safely
from .outcome import ALLOWED, DENIED, LimitOutcome
from .planning import RequestPlan
from .routes import DEFAULT_ROUTE, route_for_view

_POLICY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: The entry of the request's state (`RequestState.entry`) holding the Joint of the throttles that decided it.
_JOINT_ENTRY = "throttles"


class ThrottleHooks:
    """What our throttles add to a framework's throttle class, whichever the framework (DRF, Ninja): the
    `throttle_success()` / `throttle_failure()` hooks, and a class that sets `cache` refused when it is
    defined (our throttles count in Redis). `cache_throttle` names the framework's own cache throttle."""

    cache_throttle: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "cache" in cls.__dict__:
            raise ImproperlyConfigured(
                f"{cls.__module__}.{cls.__qualname__}.cache: ratelimit_app throttles count in Redis "
                "(RATELIMIT['REDIS_URL']), never in a Django cache. Remove the attribute, or subclass "
                f"{cls.cache_throttle} to keep the framework's cache throttle."
            )

    def metrics_label(self) -> str:
        """The `tier` label of decisions this throttle leads in the metrics."""
        return "throttle"

    def throttle_success(self) -> bool:
        """Called when this throttle's limits allow the request; returns True."""
        return True

    def throttle_failure(self) -> bool:
        """Called when this throttle's limits refuse the request; returns False."""
        return False


class _Member(Protocol):
    """One of our throttles in a joint decision."""

    @property
    def carries_request_limits(self) -> bool:
        """True for the throttle that carries the request's own limits (per-IP and tier)."""

    @property
    def owner(self) -> str:
        """The label of this throttle's checks in the joint decision (unique among the handler's)."""

    def metrics_label(self) -> str:
        """The `tier` label of decisions this throttle leads in the metrics."""


class Joint(NamedTuple):
    """One handler's joint decision for one request: the `outcome`, the request's `cost`, the `owners`
    of the handler's throttles of ours, the `carrier` (the owner of the one that answers for the
    request's own limits, and for a 401, 403 or 503) and the owners refused outright (a rate of 0:
    refused without asking Redis)."""

    handler: Any
    outcome: LimitOutcome
    cost: int
    owners: tuple[str, ...]
    carrier: str
    denied_outright: frozenset[str]

    def verdict(self, owner: str) -> tuple[bool, Decision | None]:
        """(refused, decision) of the throttle `owner`: its own limits' decision (None when it had none),
        and, for the carrier, the request's own limits' when they refused."""
        decision = self.outcome.decision_for(owner)
        refused = owner in self.denied_outright or (decision is not None and not decision.allowed)
        if self.carrier == owner:
            base = self.outcome.decision_for(REQUEST_LIMITS)
            if base is not None and not base.allowed:
                return True, base
        return refused, decision

    @property
    def refused(self) -> bool:
        """True when one of the handler's throttles of ours refuses the request: over its own limits, or
        the carrier for the request's own (over a rate, or a 401, 403 or 503)."""
        return self.outcome.status not in (ALLOWED, DENIED) or any(self.verdict(o)[0] for o in self.owners)


class JointCall(NamedTuple):
    """What one handler's throttles decide for one request: `members` in the framework's order,
    `checks_of(member)` (its checks, [] when it does not limit this request, None when it refuses it
    outright), the cost and tier scope of the request, the authenticated `user` (the framework's),
    whether the request's own limits are part of the call, `extra()`, more checks (the view's own
limit; called during the decision, so it may read the request's user), and the `usage` the handler
estimates (ratelimit_app.apply.usage), reserved with the request's own limits when they are part of the
call, and settled when the request ends."""

    request: HttpRequest
    handler: Any
    members: Sequence[_Member]
    checks_of: Callable[[Any], list[LimitCheck] | None]
    cost: int
    scope: str
    user: Any
    with_request_limits: bool
    extra: Callable[[], Sequence[LimitCheck]] = lambda: ()
    usage: Usage = ()

    @property
    def carrier(self) -> _Member:
        """The member that answers for the request's own limits: a TierRateThrottle, else the first."""
        return next((m for m in self.members if m.carries_request_limits), self.members[0])

    def decide(self, denied: set[str]) -> LimitOutcome:
        """Every member's checks (and the request's own limits when they are part of the call) in one
        call; the owners of members whose rate is 0 are added to `denied` (refused, nothing asked)."""
        extra: list[LimitCheck] = []
        leader = self.carrier
        for member in self.members:
            checks = self.checks_of(member)
            if checks is None:
                denied.add(member.owner)
            elif checks and not extra:
                leader = member
            extra.extend(checks or ())
        if denied:  # a rate of 0: refused without asking Redis, nothing charged
            return LimitOutcome(DENIED, None, (), None, "")
        extra.extend(self.extra())
        if self.with_request_limits and self.usage:
            outcome, meter = usage_limits.limit_request(self.request, cost=self.cost, scope=self.scope,
                                                        usage=self.usage, extra=extra, user=self.user)
            hold_usage(self.request, meter)
            return outcome
        if self.with_request_limits:
            return limit_request(self.request, cost=self.cost, scope=self.scope, user=self.user, extra=extra)
        if not extra:
            return LimitOutcome(ALLOWED, None, (), None, "")
        plan = RequestPlan(tuple(extra), None, _display_identity(extra[0]), limit_config().fail_mode,
                           label=leader.metrics_label())
        return decide(plan, self.cost)


def decide_jointly(call: JointCall, *, where: str, run: Callable[[Callable[[], LimitOutcome]], LimitOutcome]
                   = lambda decide_now: decide_now()) -> Joint:
    """Make `call` (following the fail mode if the limiter fails: `safely`), and keep it on the request's
    state (`joint_of`). When it decided limits, its outcome is the request's (`admission.record`: the
    headers, the slots it took held until the request ends); `run` runs the decision (Ninja's runs it
    where it may be on an event loop)."""
    denied: set[str] = set()
    outcome = safely(lambda: run(lambda: call.decide(denied)), where=where)
    state = state_of(call.request)
    if outcome.decision is not None and outcome.policies:
        # (the framework answers a refusal in its own way; when no limit was decided, a request whose own
        # limits were left to the throttles is charged on the way out by RateLimitMiddleware)
        record(call.request, outcome, call.cost)
    joint = Joint(call.handler, outcome, call.cost, tuple(m.owner for m in call.members), call.carrier.owner,
                  frozenset(denied))
    state.entry[_JOINT_ENTRY] = joint
    return joint


def joint_of(request: HttpRequest, handler: Any = None) -> Joint | None:
    """The joint decision made for `request` (for `handler` when one is given: a request dispatched
    again to another handler is decided again), None when none was made."""
    state = state_if_any(request)
    joint: Joint | None = state.entry.get(_JOINT_ENTRY) if state is not None else None
    if joint is None or (handler is not None and joint.handler is not handler):
        return None
    return joint


def request_charge(request: HttpRequest, declared: Any) -> tuple[int, str, bool]:
    """(cost, scope, deferred) of `request` for the throttles of the handler `declared` (its function or
    class: see routes.route_for_view): those RateLimitMiddleware left to them when it deferred the
    request's own limits (`deferred` True), else the handler's declared route's."""
    state = state_if_any(request)
    left = state.take_deferred() if state is not None else None
    if left is not None:
        return left[0], left[1], True
    route = route_for_view(declared) if declared is not None else DEFAULT_ROUTE
    return route.cost_for(request.method), route.scope, False


@lru_cache(maxsize=1024)
def _throttle_policy(scope: str, requests: int, seconds: float, algorithm: str) -> Policy | None:
    """The policy of a throttle's scope and rate, named after the scope (made safe for a policy name);
    None for a rate of 0 (refuse every request). Raises InvalidPolicy for a rate the engine refuses."""
    if requests == 0:
        return None
    name = scope if _POLICY_NAME.match(scope) else (
        re.sub(r"[^A-Za-z0-9_.-]", "_", scope)[:50] + "-" + hashlib.blake2b(scope.encode(), digest_size=4).hexdigest()
    )
    return Policy(name, algorithm, limit=requests, period=seconds)


def _display_identity(check: LimitCheck) -> str:
    """What operators read for the identity of a throttle's check: the label its throttle set (see
    `_throttle_label`), else "throttle:#<digest>" (a throttle of the project's own, whose identity may hold
    anything)."""
    return check.label or f"throttle:#{identity_digest(check.identity)}"


def retry_wait(decision: Decision | None, floor: float) -> float | None:
    """Seconds until a refusing `decision` allows again, at least `floor` (a throttle's `wait()`); None
    when it did not refuse, or refused for good (a cost over the limit's capacity)."""
    if decision is None or decision.allowed or decision.retry_after is None or math.isinf(decision.retry_after):
        return None
    return max(float(decision.retry_after), floor)


def scope_rate(throttle: Any, framework_base: type, defaults: Mapping[str, Any]) -> Any:
    """The rate of `throttle`'s scope (DRF's and Ninja's `get_rate`): from a `THROTTLE_RATES` attribute
    of one of its classes other than `framework_base` (whose copy of the setting was taken at import),
    else from the framework's setting `defaults`, read now. ImproperlyConfigured, in the frameworks' own
    words, when there is no scope or no rate for it."""
    scope = getattr(throttle, "scope", None)
    if not scope:
        raise ImproperlyConfigured(f"You must set either `.scope` or `.rate` for '{type(throttle).__name__}' throttle")
    own = next((k.__dict__["THROTTLE_RATES"] for k in type(throttle).__mro__
                if k is not framework_base and "THROTTLE_RATES" in k.__dict__), None)
    rates = own if own is not None else defaults
    try:
        return rates[str(scope)]
    except KeyError:
        raise ImproperlyConfigured(f"No default throttle rate set for '{scope}' scope") from None


class _RateThrottle(Protocol):
    """A throttle of the SimpleRateThrottle contract DRF and Ninja share: a `scope`, the `cache_format` of
    its cache keys, `get_ident(request)`, and ours adds the engine `algorithm` and the `owner` of its check."""

    @property
    def scope(self) -> Any: ...

    @property
    def cache_format(self) -> str: ...

    @property
    def algorithm(self) -> str: ...

    @property
    def owner(self) -> str: ...

    def get_ident(self, request: Any) -> str | None: ...


def rate_check(throttle: _RateThrottle, request: Any, key: str, identity: str, requests: int,
               seconds: float) -> list[LimitCheck] | None:
    """The check of `throttle`'s rate (`requests` per `seconds`) on `identity`, where `key` is its cache
    key for `request` (what operators read for it: `_throttle_label`); None for a rate of 0 (refuse
    every request)."""
    scope = str(throttle.scope or "throttle")
    policy = _throttle_policy(scope, requests, seconds, throttle.algorithm)
    if policy is None:
        return None
    user = authenticated_user(request)
    label = _throttle_label(scope, key, throttle.cache_format, None if user is None else user.pk,
                           lambda: throttle.get_ident(request))
    return [LimitCheck(identity, (policy,), throttle.owner, label)]


def _throttle_label(scope: str, key: str, cache_format: str, user_pk: Any, address: Callable[[], str | None]) -> str:
    """The label of a DRF or Ninja throttle's identity: "user:<pk>" or "ip:<address>" when `key` is the
    framework's own cache key of the request (`cache_format` over the user's pk or the client's address,
    `address()`), else "throttle.<scope>:#<digest>": a get_cache_key of the project's may hold anything
    (an e-mail address), so it is shown as a digest of the key, named by the throttle's scope."""
    own = cache_format % {"scope": scope, "ident": ""}
    if key.startswith(own):
        ident = key[len(own):]
        if user_pk is not None and ident == str(user_pk):
            return f"user:{user_pk}"
        client = address()
        if client is not None and ident == client:
            return f"ip:{client}"
    return f"throttle.{scope}:#{identity_digest(key)}"
