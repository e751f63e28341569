"""What our throttles share whatever the framework (DRF's: ratelimit_app.drf; Django Ninja's:
ratelimit_app.ninja): `decide_jointly` admits a request for every throttle of ours on one handler in one
call (`admission.admit`), and `Joint.verdict` is what each of them answers for; the hooks, rates, checks
and waits of their SimpleRateThrottle contract.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, ClassVar, NamedTuple, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from ..core.decision import Decision
from ..core.engine import Usage
from ..core.policies import Policy
from .admission import Extra, Throttles, admit, record, state_if_any, state_of
from .identity import authenticated_user
from .limitcheck import REQUEST_LIMITS, LimitCheck, identity_digest
from .outcome import ALLOWED, DENIED, LimitOutcome
from .routes import DEFAULT_ROUTE, route_for_view

_POLICY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: The entry of the request's state holding the Joint of the throttles that decided it.
_JOINT_ENTRY = "throttles"


class ThrottleHooks:
    """What our throttles add to a framework's throttle class, whichever the framework (DRF, Ninja): an
    `owner` labelling its checks (unique among a handler's), the `throttle_success()` /
    `throttle_failure()` hooks, and a class that sets `cache` refused when it is defined (ours count in
    Redis; `cache_throttle` names the framework's own cache throttle)."""

    cache_throttle: str = ""
    #: True for the throttle that carries the request's own limits (per-IP and tier).
    carries_request_limits: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "cache" in cls.__dict__:
            raise ImproperlyConfigured(
                f"{cls.__module__}.{cls.__qualname__}.cache: ratelimit_app throttles count in Redis "
                "(RATELIMIT['REDIS_URL']), never in a Django cache. Remove the attribute, or subclass "
                f"{cls.cache_throttle} to keep the framework's cache throttle."
            )

    @property
    def owner(self) -> str:
        raise NotImplementedError

    def metrics_label(self) -> str:
        """The `tier` label of decisions this throttle leads in the metrics."""
        return "throttle"

    def throttle_success(self) -> bool:
        return True

    def throttle_failure(self) -> bool:
        return False


class Joint(NamedTuple):
    """One handler's joint decision for one request: the `outcome`, the request's `cost`, the `owners`
    of the handler's throttles of ours, the `carrier` (the owner of the one that answers for the
    request's own limits, and for a 401, 403 or 503) and the owners refused outright (a rate of 0)."""

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
        """True when one of the handler's throttles of ours refuses the request (over its own limits, or
        the carrier for the request's own: over a rate, or a 401, 403 or 503)."""
        return self.outcome.status not in (ALLOWED, DENIED) or any(self.verdict(o)[0] for o in self.owners)


def decide_jointly(request: HttpRequest, handler: Any, members: Sequence[ThrottleHooks],
                   checks_of: Callable[[Any], Sequence[LimitCheck] | None], *, cost: int, scope: str, user: Any,
                   request_limits: bool, where: str, extra: Extra = (), usage: Usage = (),
                   run: Callable[[Callable[[], LimitOutcome]], LimitOutcome] | None = None) -> Joint:
    """Admit `request` for the throttles of ours on `handler` (`members`, in the framework's order; the
    carrier is the one carrying the request's own limits, else the first) in one `admission.admit`:
    `checks_of(member)` ([]: it does not limit this request; None: it refuses it outright), the request's
    own limits when `request_limits`, `extra` (the view's own limit) and `usage`. The outcome is recorded
    only when it decided limits (else RateLimitMiddleware charges deferred request limits on the way out);
    the Joint is kept on the request's state (`joint_of`)."""
    carrier = next((m for m in members if m.carries_request_limits), members[0])
    denied: set[str] = set()

    def checks() -> tuple[list[LimitCheck], str] | None:
        found: list[LimitCheck] = []
        leader = carrier
        for member in members:
            own = checks_of(member)
            if own is None:
                denied.add(member.owner)
            elif own and not found:
                leader = member
            found.extend(own or ())
        return None if denied else (found, leader.metrics_label())

    def keep(request: HttpRequest, outcome: LimitOutcome, cost: int) -> None:
        if outcome.decision is not None and outcome.policies:
            record(request, outcome, cost)
        state_of(request).entry[_JOINT_ENTRY] = Joint(handler, outcome, cost, tuple(m.owner for m in members),
                                                      carrier.owner, frozenset(denied))

    admit(request, cost=cost, scope=scope, extra=extra, where=where, usage=usage,
          user=user, throttles=Throttles(checks, request_limits), run=run, answer=keep)
    joint: Joint = state_of(request).entry[_JOINT_ENTRY]
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
    class): those RateLimitMiddleware left to them (`deferred` True), else the declared route's."""
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


def retry_wait(decision: Decision | None, floor: float) -> float | None:
    """Seconds until a refusing `decision` allows again, at least `floor` (a throttle's `wait()`); None
    when it did not refuse, or refused for good (a cost over the limit's capacity)."""
    if decision is None or decision.allowed or decision.retry_after is None or math.isinf(decision.retry_after):
        return None
    return max(float(decision.retry_after), floor)


def scope_rate(throttle: Any, framework_base: type, defaults: Mapping[str, Any]) -> Any:
    """The rate of `throttle`'s scope (DRF's and Ninja's `get_rate`): from a `THROTTLE_RATES` attribute of
    one of its classes other than `framework_base` (whose copy was taken at import), else from `defaults`,
    read now. ImproperlyConfigured, in the frameworks' own words, for no scope or no rate."""
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
    """The check of `throttle`'s rate (`requests` per `seconds`) on `identity`, `key` being its cache key
    for `request`; None for a rate of 0 (refuse every request)."""
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
