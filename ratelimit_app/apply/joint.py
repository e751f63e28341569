"""The joint decision of our throttles, for any framework that asks throttles one by one (DRF, Django
Ninja): every throttle of ours on one handler (a DRF view, a Ninja operation), the view's own limit
(`@ratelimit`) and the request's own limits (per-IP and tier) when they are decided there, in ONE
all-or-nothing call made when the framework asks the first of them. A request refused by any limit is
charged to none; each throttle then answers for its own limits (`Joint.verdict`).

Which throttles sit on a handler, and how each names its checks, is the framework's part
(ratelimit_app.apply.jointthrottle for DRF, ratelimit_app.ninja for Ninja); deciding them together is
this module's. `in_sync_code` lets a framework that asks its throttles synchronously even on an event
loop (Ninja does, for `async def` operations) decide there without Django I/O on the loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol, TypeVar

from django.core.exceptions import ImproperlyConfigured, SynchronousOnlyOperation
from django.db import connections
from django.http import HttpRequest

from ..core.decision import Decision
from ..core.policies import Policy
from ..plans.lookups import NeedsIO, local_only
from .admission import state_of
from .limitcheck import REQUEST_LIMITS, LimitCheck, identity_digest
from .limiting import decide, limit_config, safely
from .outcome import ALLOWED, DENIED, LimitOutcome
from .planning import RequestPlan, plan_request

T = TypeVar("T")
_POLICY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


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


class Member(Protocol):
    """One of our throttles in a joint decision."""

    @property
    def carries_request_limits(self) -> bool:
        """True for the throttle that carries the request's own limits (per-IP and tier)."""

    @property
    def owner(self) -> str:
        """The label of this throttle's checks in the joint decision (unique among the handler's)."""

    def metrics_label(self) -> str:
        """The `tier` label of decisions this throttle leads in the metrics."""


@dataclass(frozen=True)
class Joint:
    """One handler's joint decision for one request: the `outcome`, the `carrier` (owner of the throttle
    that answers for the request's own limits, and for a 401, 403 or 503) and the owners refused
    outright (a rate of 0: refused without asking Redis)."""

    handler: Any
    outcome: LimitOutcome
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


@dataclass(frozen=True)
class JointCall:
    """What one handler's throttles decide for one request: `members` in the framework's order,
    `checks_of(member)` (its checks, [] when it does not limit this request, None when it refuses it
    outright), the cost and tier scope of the request, the authenticated `user` (the framework's),
    whether the request's own limits are part of the call, and `extra()`, more checks (the view's own
limit; called during the decision, so it may read the request's user)."""

    request: HttpRequest
    handler: Any
    members: Sequence[Member]
    checks_of: Callable[[Any], list[LimitCheck] | None]
    cost: int
    scope: str
    user: Any
    with_request_limits: bool
    extra: Callable[[], Sequence[LimitCheck]] = lambda: ()

    @property
    def carrier(self) -> Member:
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
        if self.with_request_limits:
            planned = plan_request(self.request, cost=self.cost, scope=self.scope, user=self.user)
            if isinstance(planned, LimitOutcome):
                return planned
            return decide(planned if planned.refusal else planned.plus(extra), self.cost)
        if not extra:
            return LimitOutcome(ALLOWED, None, (), None, "")
        plan = RequestPlan(tuple(extra), None, display_identity(extra[0]), limit_config().fail_mode,
                           label=leader.metrics_label())
        return decide(plan, self.cost)


def decide_jointly(call: JointCall, *, where: str, run: Callable[[Callable[[], LimitOutcome]], LimitOutcome]
                   = lambda decide_now: decide_now()) -> Joint:
    """Make `call` (following the fail mode if the limiter fails: `safely`), hold the concurrency slots
    it took on the request (given back with the response: RateLimitMiddleware or the framework's
    finisher) and leave its outcome on the request for the headers. `run` runs the decision
    (`in_sync_code` where it may be on an event loop)."""
    denied: set[str] = set()
    outcome = safely(lambda: run(lambda: call.decide(denied)), where=where)
    state = state_of(call.request)
    state.hold(outcome.slots)
    if outcome.decision is not None and outcome.policies:
        state.outcome = outcome
    return Joint(call.handler, outcome, call.carrier.owner, frozenset(denied))


@lru_cache(maxsize=1024)
def throttle_policy(scope: str, requests: int, seconds: float, algorithm: str) -> Policy | None:
    """The policy of a throttle's scope and rate, named after the scope (made safe for a policy name);
    None for a rate of 0 (refuse every request). Raises InvalidPolicy for a rate the engine refuses."""
    if requests == 0:
        return None
    name = scope if _POLICY_NAME.match(scope) else (
        re.sub(r"[^A-Za-z0-9_.-]", "_", scope)[:50] + "-" + hashlib.blake2b(scope.encode(), digest_size=4).hexdigest()
    )
    return Policy(name, algorithm, limit=requests, period=seconds)


def display_identity(check: LimitCheck) -> str:
    """What operators read for the identity of a throttle's check: the label its throttle set (see
    `throttle_label`), else "throttle:#<digest>" (a throttle of the project's own, whose identity may hold
    anything)."""
    return check.label or f"throttle:#{identity_digest(check.identity)}"


def throttle_label(scope: str, key: str, cache_format: str, user_pk: Any, address: Callable[[], str | None]) -> str:
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


def in_sync_code(decide_now: Callable[[], T]) -> T:
    """Run the sync limiting code `decide_now` (plan, then decide) from a caller that may be on an event
    loop.

    Off a loop, it simply runs. On a loop (a framework that asks its throttles synchronously from an
    `async def` view), it runs right there when it needs no Django I/O: planning answers from this
    process' lookup cache (`local_only`) and the decision is one Redis call with the sync engine,
    bounded like every call by RATELIMIT['BUDGET_MS']. When it would need the database or the shared
    cache (a cold lookup, a session user not read yet), it runs in a thread of its own instead, the
    loop waiting for it, whose database connections are closed when it is done.
    """
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
