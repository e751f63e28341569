"""How a view decorated with `@ratelimit` or `@limit_concurrency` (ratelimit_app.decorators) decides: its
check, decided with the request's own limits by the middleware when it can
(`DecoratorLimit.joins_request_limits`), else admitted alone (`admission.admit`, `aadmit` for an
`async def` view), its response finished by the admission path."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from .apply import limiting_async, planning_async
from .apply.admission import Throttles, admit, end, finish, outcome_of, record, state_of
from .apply.admission_async import aadmit, aend, afinish
from .apply.concurrency import middleware_installed
from .apply.identity import authenticated_user, request_ip_identity, user_identity
from .apply.limitcheck import LimitCheck, identity_digest
from .apply.limiting import safely
from .apply.outcome import ALLOWED, DENIED, NOT_LIMITED, UNAVAILABLE, LimitOutcome
from .apply.responses import refusal
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
        self.policies = (policy,)
        self.namespace = namespace
        self.owner = f"decorator:{namespace}"
        self.where = f"@ratelimit ({namespace})"  # where a failure of this limit is logged from
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

    def _labelled_check(self, request: HttpRequest) -> LimitCheck | None:
        """`check_for`, labelled for operators (the metrics, the denial log) by the client it limits."""
        check = self.check_for(request)
        return None if check is None else check._replace(label=self.label_of(check.identity.partition("|")[2]))

    def _alone(self, request: HttpRequest) -> Throttles:
        """This view's check decided alone (`admit`'s throttles mode), led in the metrics by the decorator."""
        def checks() -> tuple[tuple[LimitCheck, ...], str]:
            check = self._labelled_check(request)
            return ((check,) if check is not None else ()), _DECORATOR_TIER
        return Throttles(checks, request_limits=False)

    def _keep(self, request: HttpRequest, outcome: LimitOutcome, cost: int) -> HttpResponseBase | None:
        """Keep this limit's `outcome` (`entry[owner]`), and record it unless another entry point's is
        recorded (the middleware's, decided first, stands; so do request limits left to throttles, which
        the middleware charges late when nothing was recorded): the refusal to send, or None."""
        state = state_of(request)
        mine = state.entry.get(self.owner)
        state.entry[self.owner] = outcome
        if state.deferred is None and (state.outcome is None or state.outcome is mine):
            return record(request, outcome, cost)
        state.hold(outcome.slots)
        return None if outcome.status == ALLOWED else refusal(outcome, cost)

    def _refusing(self, decision: Decision, label: str, charged: bool = True) -> LimitOutcome:
        """The outcome of this limit refusing with `decision` (503 when it was made without Redis)."""
        return LimitOutcome(UNAVAILABLE if decision.degraded else DENIED, decision, self.policies, None, label,
                            charged=charged)

    def _before(self, decision: Decision, label: str) -> LimitOutcome:
        """Counted by outcome, before the view: the outcome of the peek (a refusal is counted)."""
        if decision.allowed:
            return LimitOutcome(ALLOWED, decision, self.policies, None, label, charged=False)
        events.record_decision(allowed=False, tier=_DECORATOR_TIER, policy=decision.policy,
                                degraded=decision.degraded, identity=label)
        return self._refusing(decision, label, charged=False)

    def _reserves(self) -> bool:
        return bool(self.reserving) and request_settings().values.get("BACKEND") != "memory"

    def check_before(self, check: LimitCheck, held: list[Reservation]) -> LimitOutcome:
        """Counted by outcome, before the view: reserve the request's cost (held in `held`), or, where it
        cannot be settled, peek whether one more matching response fits."""
        if self._reserves():
            decisions, reservation = get_limiter().reserve_many([(check.identity, self.reserving)], 1,
                                                                ((OUTCOME_UNIT, self.cost),))
            held.append(reservation)
            return self._before(decisions[0], check.label)
        return self._before(get_limiter().peek(check.identity, self.policies, self.cost, fresh=True), check.label)

    async def acheck_before(self, check: LimitCheck, held: list[Reservation]) -> LimitOutcome:
        """`check_before` on the event loop."""
        if self._reserves():
            decisions, reservation = await get_async_limiter().reserve_many(
                [(check.identity, self.reserving)], 1, ((OUTCOME_UNIT, self.cost),))
            held.append(reservation)
            return self._before(decisions[0], check.label)
        decision = await get_async_limiter().peek(check.identity, self.policies, self.cost, fresh=True)
        return self._before(decision, check.label)

    def charge_after(self, check: LimitCheck, counted: bool, held: list[Reservation]) -> LimitOutcome:
        """Counted by outcome, after the view: settle what it reserved (at its cost when it `counted`, else
        0), or charge it when it counted (NOT_LIMITED: no decision of its own)."""
        events.record_decision(allowed=True, tier=_DECORATOR_TIER, policy=None, degraded=False, identity=check.label)
        if held:
            get_limiter().settle(held.pop(), {OUTCOME_UNIT: self.cost if counted else 0})
        elif counted:
            # A charge that no longer fits (requests in flight passed the check together) is refused by the
            # script and charges nothing: the counter never goes over the limit.
            decision = get_limiter().hit(check.identity, self.policies, self.cost)
            return LimitOutcome(ALLOWED, decision, self.policies, None, check.label)
        return NOT_LIMITED

    async def acharge_after(self, check: LimitCheck, counted: bool, held: list[Reservation]) -> LimitOutcome:
        """`charge_after` on the event loop."""
        events.record_decision(allowed=True, tier=_DECORATOR_TIER, policy=None, degraded=False, identity=check.label)
        if held:
            await get_async_limiter().settle(held.pop(), {OUTCOME_UNIT: self.cost if counted else 0})
        elif counted:
            decision = await get_async_limiter().hit(check.identity, self.policies, self.cost)
            return LimitOutcome(ALLOWED, decision, self.policies, None, check.label)
        return NOT_LIMITED

    def answer_counted(self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """`count_if`: check before the view, run it, charge after it when the response matches."""
        check = self._labelled_check(request)
        if check is None:
            return view(request, *args, **kwargs)
        held: list[Reservation] = []
        before = safely(lambda: self.check_before(check, held), where=self.where)
        refused = self._limited(request, self._keep(request, before, self.cost))
        if refused is not None:
            return refused
        try:
            response = view(request, *args, **kwargs)
        except BaseException:
            safely(lambda: self.charge_after(check, False, held), where=self.where)  # no outcome: free
            raise
        matched = self._matches(response)
        return self._charged(request, response,
                             safely(lambda: self.charge_after(check, matched, held), where=self.where))

    async def aanswer_counted(self, request: HttpRequest, view: Callable[..., Any], args: Any,
                              kwargs: Any) -> Any:
        """`answer_counted` for an `async def` view."""
        await planning_async.request_user(request)
        check = self._labelled_check(request)
        if check is None:
            return await view(request, *args, **kwargs)
        held: list[Reservation] = []
        before = await limiting_async.safely(lambda: self.acheck_before(check, held), where=self.where)
        refused = self._limited(request, self._keep(request, before, self.cost))
        if refused is not None:
            return refused
        try:
            response = await view(request, *args, **kwargs)
        except BaseException:
            await limiting_async.safely(lambda: self.acharge_after(check, False, held), where=self.where)
            raise
        matched = self._matches(response)
        after = await limiting_async.safely(lambda: self.acharge_after(check, matched, held),
                                            where=self.where)
        return self._charged(request, response, after)

    def _charged(self, request: HttpRequest, result: Any, after: LimitOutcome) -> Any:
        """Counted by outcome: a response finished with the charge after the view (or, when that settled a
        reservation and so has no decision of its own, with the outcome before it)."""
        if after.decision is not None:
            self._keep(request, after, self.cost)
        return finish(request, result) if isinstance(result, HttpResponseBase) else result

    def _matches(self, response: Any) -> bool:
        return self.count_if is not None and bool(self.count_if(response))

    def _decided(self, request: HttpRequest) -> HttpResponseBase | None:
        """The refusal to send (None: the view runs), decided with the middleware's limits when they owned
        this view's check, else alone (`admit`)."""
        joint = outcome_of(request)
        if joint is not None and joint.owns(self.owner):
            return self._joined(request, joint)
        return self._limited(request, admit(request, cost=self.cost, where=self.where, throttles=self._alone(request),
                                            answer=self._keep))

    async def _adecided(self, request: HttpRequest) -> HttpResponseBase | None:
        """`_decided` on the event loop."""
        joint = outcome_of(request)
        if joint is not None and joint.owns(self.owner):
            return self._joined(request, joint)
        return self._limited(request, await aadmit(request, cost=self.cost, where=self.where,
                                                   throttles=self._alone(request), answer=self._keep))

    def _joined(self, request: HttpRequest, joint: LimitOutcome) -> HttpResponseBase | None:
        """Decided with the middleware's limits: refused over this limit's own decision."""
        decision = joint.decision_for(self.owner)
        if decision is None or decision.allowed:
            return self._limited(request, None)
        return self._limited(request, refusal(self._refusing(decision, ""), self.cost))

    def _limited(self, request: HttpRequest, refused: HttpResponseBase | None) -> HttpResponseBase | None:
        """Leave `request.limited`; the refusal to send (None: the view runs, always with block=False)."""
        request.limited = refused is not None  # type: ignore[attr-defined]
        return refused if self.block else None

    def answer(self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Decide, then run the view (its result: a response, or a Ninja operation's data) or refuse."""
        if self.count_if is not None:
            return self.answer_counted(request, view, args, kwargs)
        refused = self._decided(request)
        if refused is not None:
            return refused
        try:
            result = view(request, *args, **kwargs)
        except BaseException:
            end(request)  # no response will be closed
            raise
        if isinstance(result, HttpResponseBase):
            return finish(request, result)
        if not middleware_installed():
            end(request)  # a Ninja operation's data: the view's own work is over
        return result

    async def aanswer(self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """`answer` for an `async def` view, on the event loop."""
        if self.count_if is not None:
            return await self.aanswer_counted(request, view, args, kwargs)
        refused = await self._adecided(request)
        if refused is not None:
            return refused
        try:
            result = await view(request, *args, **kwargs)
        except BaseException:
            await aend(request)  # no response will be closed
            raise
        if isinstance(result, HttpResponseBase):
            return await afinish(request, result)
        if not middleware_installed():
            await aend(request)  # a Ninja operation's data: the view's own work is over
        return result


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
