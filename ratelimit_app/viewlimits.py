"""How a view decorated with `@ratelimit` or `@limit_concurrency` (ratelimit_app.decorators) decides: its
check, decided with the request's own limits by the middleware when it can
(`DecoratorLimit.joins_request_limits`), else by the view alone, sync or `async def`."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from .apply import limiting_async, planning_async
from .apply.admission import outcome_of, release_after
from .apply.admission_async import arelease_after
from .apply.headers import apply_headers
from .apply.identity import authenticated_user, request_ip_identity, user_identity
from .apply.limitcheck import LimitCheck, identity_digest
from .apply.limiting import decide, limit_config, safely
from .apply.outcome import ALLOWED, DENIED, NOT_LIMITED, UNAVAILABLE, LimitOutcome
from .apply.planning import RequestPlan
from .apply.responses import limiter_unavailable, too_many_requests
from .apply.routes import VIEW_LIMIT_ATTRIBUTE, ViewT
from .conf.snapshot import request_settings
from .core.decision import Decision
from .core.policies import CONCURRENCY, Policy
from .core.usage import Reservation
from .service import events
from .service.limiter import get_limiter
from .service.limiter_async import get_async_limiter

KeyFunction = Callable[[HttpRequest], "str | None"]
CountIf = Callable[[HttpResponseBase], bool]

#: `tier` label of the decorator's decisions in the metrics.
_DECORATOR_TIER = "decorator"


def key_function_for(key: str | KeyFunction) -> KeyFunction:
    if callable(key):
        return key
    if key == "ip":
        return request_ip_identity
    if key == "user":
        def by_user(request: HttpRequest) -> str:
            user = authenticated_user(request)
            return user_identity(user.pk) if user is not None else request_ip_identity(request)
        return by_user
    if isinstance(key, str) and key.lower().startswith("header:") and key[len("header:"):].strip():
        header = key[len("header:"):].strip()
        meta = "HTTP_" + header.upper().replace("-", "_")

        def by_header(request: HttpRequest) -> str:
            # The value is user input: the engine hashes identities, so it never becomes a key name.
            return f"header:{header.lower()}:{request.META.get(meta, '')}"
        return by_header
    if isinstance(key, str) and key.lower().startswith("post:") and key[len("post:"):].strip():
        field = key[len("post:"):].strip()

        def by_post_field(request: HttpRequest) -> str:
            # A form field (a username): user input, hashed by the engine like every identity.
            return f"post:{field}:{request.POST.get(field, '')}"
        return by_post_field
    raise ValueError(f"key: {key!r} must be 'ip', 'user', 'header:<name>', 'post:<field>' or a callable")


def plain_label(client: str) -> str:
    return client


def digest_label(client: str) -> str:
    """The label of an identity that may hold user data: "header:<name>:#<digest>", "post:<field>:#<digest>",
    or "custom:#<digest>" (a key function's)."""
    scheme, _, rest = client.partition(":")
    what = f"{scheme}:{rest.partition(':')[0]}" if scheme in ("header", "post") else "custom"
    return f"{what}:#{identity_digest(client)}"


#: The unit in which a limit counted by outcome reserves a request's cost (settled when the view has answered).
OUTCOME_UNIT = "responses"


class DecoratorLimit:
    """The limit of one decorated view (a `routes.ViewLimit`)."""

    def __init__(self, policy: Policy, namespace: str, key_function: KeyFunction,
                 label_of: Callable[[str], str], block: bool, cost: int, count_if: CountIf | None = None) -> None:
        self.policy = policy
        self.policies = (policy,)
        self.namespace = namespace
        self.owner = f"decorator:{namespace}"
        self.key_function = key_function
        self.label_of = label_of
        self.block = block
        self.cost = cost
        self.count_if = count_if
        # Decided with the middleware's limits (when the route's cost is this cost) only when a refusal
        # by this limit refuses the request: with block=False the view runs anyway, so charging the
        # request's other limits must not depend on this one. A limit counted by outcome is charged
        # after the view, on its own.
        self.joins_request_limits = block and count_if is None
        # Counted by outcome, in Redis: each request reserves its cost in one unit of its own in the decision
        # before the view (so requests in flight together never pass one limit), settled to the cost when
        # the response matches and to 0 when it does not. A calendar quota and a shadow limit, which are not
        # settled, and the memory backend, which keeps no reservations, peek before the view and charge after.
        settles = not (policy.calendar or policy.shadow or policy.algorithm == CONCURRENCY)
        self.reserving = (dataclasses.replace(policy, unit=OUTCOME_UNIT),) if count_if is not None and settles else ()

    def check_for(self, request: HttpRequest) -> LimitCheck | None:
        """This view's check for `request` (None: its key function says "not limited")."""
        client = self.key_function(request)
        if client is None:
            return None
        return LimitCheck(f"view:{self.namespace}|{client}", self.policies, self.owner)

    def _plan_alone(self, request: HttpRequest) -> RequestPlan | None:
        """The plan of this view's limit decided alone (None: not limited)."""
        check = self.check_for(request)
        if check is None:
            return None
        client = check.identity.partition("|")[2]
        return RequestPlan((check,), None, self.label_of(client), limit_config().fail_mode, label=_DECORATOR_TIER)

    def decide_alone(self, request: HttpRequest) -> LimitOutcome:
        """Charge this view's limit alone (NOT_LIMITED: its key function says this request is not limited)."""
        plan = self._plan_alone(request)
        return NOT_LIMITED if plan is None else decide(plan, self.cost)

    async def adecide_alone(self, request: HttpRequest) -> LimitOutcome:
        """`decide_alone` on the event loop (the session user read without blocking it)."""
        await planning_async.request_user(request)
        plan = self._plan_alone(request)
        return NOT_LIMITED if plan is None else await limiting_async.decide(plan, self.cost)

    def _counted_check(self, request: HttpRequest) -> tuple[LimitCheck, str] | None:
        """Counted by outcome: this request's check and its label (None: not limited)."""
        check = self.check_for(request)
        return None if check is None else (check, self.label_of(check.identity.partition("|")[2]))

    def _before(self, decision: Decision, label: str) -> LimitOutcome:
        """Counted by outcome, before the view: the outcome of the peek (a refusal is counted)."""
        if decision.allowed:
            return LimitOutcome(ALLOWED, decision, self.policies, None, label, charged=False)
        events.record_decision(allowed=False, tier=_DECORATOR_TIER, policy=decision.policy,
                                degraded=decision.degraded, identity=label)
        return LimitOutcome(UNAVAILABLE if decision.degraded else DENIED, decision, self.policies, None, label,
                            charged=False)

    def _reserves(self) -> bool:
        return bool(self.reserving) and request_settings().values.get("BACKEND") != "memory"

    def check_before(self, check: LimitCheck, label: str, held: list[Reservation]) -> LimitOutcome:
        """Counted by outcome, before the view: reserve the request's cost (held in `held`), or, where it
        cannot be settled, peek whether one more matching response fits."""
        if self._reserves():
            decisions, reservation = get_limiter().reserve_many([(check.identity, self.reserving)], 1,
                                                                ((OUTCOME_UNIT, self.cost),))
            held.append(reservation)
            return self._before(decisions[0], label)
        return self._before(get_limiter().peek(check.identity, self.policies, self.cost, fresh=True), label)

    async def acheck_before(self, check: LimitCheck, label: str, held: list[Reservation]) -> LimitOutcome:
        """`check_before` on the event loop."""
        if self._reserves():
            decisions, reservation = await get_async_limiter().reserve_many(
                [(check.identity, self.reserving)], 1, ((OUTCOME_UNIT, self.cost),))
            held.append(reservation)
            return self._before(decisions[0], label)
        decision = await get_async_limiter().peek(check.identity, self.policies, self.cost, fresh=True)
        return self._before(decision, label)

    def _count_after(self, label: str) -> None:
        events.record_decision(allowed=True, tier=_DECORATOR_TIER, policy=None, degraded=False, identity=label)

    def charge_after(self, check: LimitCheck, label: str, counted: bool, held: list[Reservation]) -> LimitOutcome:
        """Counted by outcome, after the view: settle what it reserved (at its cost when it `counted`, else
        0), or charge it when it counted."""
        self._count_after(label)
        if held:
            get_limiter().settle(held.pop(), {OUTCOME_UNIT: self.cost if counted else 0})
            return LimitOutcome(ALLOWED, None, self.policies, None, label, charged=counted)
        if not counted:
            return LimitOutcome(ALLOWED, None, self.policies, None, label, charged=False)
        # A charge that no longer fits (requests in flight passed the check together) is refused by the
        # script and charges nothing: the counter never goes over the limit.
        decision = get_limiter().hit(check.identity, self.policies, self.cost)
        return LimitOutcome(ALLOWED, decision, self.policies, None, label)

    async def acharge_after(self, check: LimitCheck, label: str, counted: bool,
                            held: list[Reservation]) -> LimitOutcome:
        """`charge_after` on the event loop."""
        self._count_after(label)
        if held:
            await get_async_limiter().settle(held.pop(), {OUTCOME_UNIT: self.cost if counted else 0})
            return LimitOutcome(ALLOWED, None, self.policies, None, label, charged=counted)
        if not counted:
            return LimitOutcome(ALLOWED, None, self.policies, None, label, charged=False)
        decision = await get_async_limiter().hit(check.identity, self.policies, self.cost)
        return LimitOutcome(ALLOWED, decision, self.policies, None, label)

    def answer_counted(self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """`count_if`: check before the view, run it, charge after it when the response matches."""
        counted = self._counted_check(request)
        if counted is None:
            return view(request, *args, **kwargs)
        check, label = counted
        held: list[Reservation] = []
        before = safely(lambda: self.check_before(check, label, held), where=self.where)
        decision = before.decision
        request.limited = not before.allowed  # type: ignore[attr-defined]
        if not (before.allowed or not self.block):
            return self._refused(decision)
        try:
            response = view(request, *args, **kwargs)
        except BaseException:
            safely(lambda: self.charge_after(check, label, False, held), where=self.where)  # no outcome: free
            raise
        matched = self._matches(response)
        after = safely(lambda: self.charge_after(check, label, matched, held), where=self.where)
        return self._with_headers(response, after.decision or decision)

    async def aanswer_counted(self, request: HttpRequest, view: Callable[..., Any], args: Any,
                              kwargs: Any) -> Any:
        """`answer_counted` for an `async def` view."""
        await planning_async.request_user(request)
        counted = self._counted_check(request)
        if counted is None:
            return await view(request, *args, **kwargs)
        check, label = counted
        held: list[Reservation] = []
        before = await limiting_async.safely(lambda: self.acheck_before(check, label, held), where=self.where)
        decision = before.decision
        request.limited = not before.allowed  # type: ignore[attr-defined]
        if not (before.allowed or not self.block):
            return self._refused(decision)
        try:
            response = await view(request, *args, **kwargs)
        except BaseException:
            await limiting_async.safely(lambda: self.acharge_after(check, label, False, held), where=self.where)
            raise
        matched = self._matches(response)
        after = await limiting_async.safely(lambda: self.acharge_after(check, label, matched, held),
                                            where=self.where)
        return self._with_headers(response, after.decision or decision)

    def _matches(self, response: Any) -> bool:
        return self.count_if is not None and bool(self.count_if(response))

    def _joint_decision(self, request: HttpRequest) -> tuple[bool, Decision | None]:
        """(True, the decision) when the middleware decided this view's limit; else (False, None)."""
        joint = outcome_of(request)
        if joint is not None and joint.owns(self.owner):
            return True, joint.decision_for(self.owner)
        return False, None

    def _runs(self, request: HttpRequest, decision: Decision | None) -> bool:
        """Leave `request.limited`; True when the view runs for this decision."""
        request.limited = decision is not None and not decision.allowed  # type: ignore[attr-defined]
        return decision is None or decision.allowed or not self.block

    def answer(self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Decide, then run the view (its result: a response, or a Ninja operation's data) or refuse."""
        if self.count_if is not None:
            return self.answer_counted(request, view, args, kwargs)
        joined, decision = self._joint_decision(request)
        slots = None
        if not joined:
            alone = safely(lambda: self.decide_alone(request), where=self.where)
            decision, slots = alone.decision, alone.slots
        if not self._runs(request, decision):
            return self._refused(decision)
        try:
            response = view(request, *args, **kwargs)
        except BaseException:
            if slots is not None:
                slots.release()  # no response will be closed
            raise
        release_after(request, response, slots)
        return self._with_headers(response, decision)

    async def aanswer(self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """`answer` for an `async def` view, on the event loop."""
        if self.count_if is not None:
            return await self.aanswer_counted(request, view, args, kwargs)
        joined, decision = self._joint_decision(request)
        slots = None
        if not joined:
            alone = await limiting_async.safely(lambda: self.adecide_alone(request), where=self.where)
            decision, slots = alone.decision, alone.slots
        if not self._runs(request, decision):
            return self._refused(decision)
        try:
            response = await view(request, *args, **kwargs)
        except BaseException:
            if slots is not None:
                await slots.arelease()  # no response will be closed
            raise
        await arelease_after(request, response, slots)
        return self._with_headers(response, decision)

    def _refused(self, decision: Decision | None) -> HttpResponseBase:
        """The 429 (503: the limiter could not decide), with headers."""
        if decision is None:
            return limiter_unavailable(None, None)
        if decision.degraded:
            response = limiter_unavailable(decision, None)
        else:
            response = too_many_requests(decision, None, self.cost)
        return self._with_headers(response, decision)

    def _with_headers(self, response: Any, decision: Decision | None) -> Any:
        """`response` with this limit's headers (a Ninja operation's data is returned as it is)."""
        if decision is not None and decision.results and isinstance(response, HttpResponseBase):
            apply_headers(response, decision, self.policies, None, limit_config().headers)
        return response

    @property
    def where(self) -> str:  # where a failure of this limit is logged from
        return f"@ratelimit ({self.namespace})"


def wrap_view(view: ViewT, limit: DecoratorLimit) -> ViewT:
    """The view wrapped so that `limit` decides each request (a coroutine function for an `async def` view)."""
    if iscoroutinefunction(view):
        @functools.wraps(view)
        async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            return await limit.aanswer(request, view, args, kwargs)

        wrapper: Callable[..., Any] = markcoroutinefunction(async_wrapper)
    else:
        @functools.wraps(view)
        def sync_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return limit.answer(request, view, args, kwargs)

        wrapper = sync_wrapper
    setattr(wrapper, VIEW_LIMIT_ATTRIBUTE, limit)
    return cast(ViewT, wrapper)


class ConcurrencyLimit(DecoratorLimit):
    """`@limit_concurrency`'s limit: a slot is the same whatever the route costs, so it always joins the
    middleware's call."""

    joins_at_any_cost = True
