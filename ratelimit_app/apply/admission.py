"""The admission path every entry point is an adapter over: `admit` a request (one all-or-nothing
decision, the slots it took held, the outcome recorded), then `finish` its response, or `end` it when it
ends without one. What the limiter carries through a request is one `RequestState`, in
`request.ratelimit`. The async twins are in ratelimit_app.apply.admission_async; docs/architecture.md
("The admission path") is the manual.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

from django.http import HttpRequest, HttpResponseBase

from ..conf.snapshot import Snapshot, request_settings
from ..core.engine import Usage
from . import usage as usage_limits
from .concurrency import HeldSlots, release_with
from .limitcheck import LimitCheck, identity_digest
from .limiting import decide, failure_outcome, limit_config, limit_request
from .outcome import ALLOWED, DENIED, NOT_LIMITED, LimitOutcome
from .planning import FROM_REQUEST, RequestPlan
from .responses import add_headers, refusal

#: The one request attribute of ours.
_ATTRIBUTE = "ratelimit"

#: The name under which a request's state holds what it reserved (ratelimit_app.apply.usage.UsageMeter).
USAGE_ENTRY = "usage"
#: The extra checks of `admit`: a sequence, or a callable giving it once the request's user is known.
Extra = Sequence[LimitCheck] | Callable[[], Sequence[LimitCheck]]
#: How `admit` answers its outcome (decided at a cost): `record` (the refusal to send, or None), or an
#: entry point's own (throttles answer through their framework).
Answer = Callable[[HttpRequest, LimitOutcome, int], HttpResponseBase | None]


class Throttles(NamedTuple):
    """`admit`'s mode for throttles of ours (DRF's, Ninja's, a decorated view's limit). `checks()` gives
    their checks and the metrics label of the throttle leading them; it is asked before anything else, and
    None (one of them has a rate of 0) refuses the request outright, asking nothing. With `request_limits`
    False, their checks and `extra` are decided alone: not the per-IP and tier limits (the middleware
    decided them, or the path is not limited)."""

    checks: Callable[[], tuple[Sequence[LimitCheck], str] | None]
    request_limits: bool


#: Throttles refusing outright: nothing asked, nothing charged.
REFUSED_OUTRIGHT = LimitOutcome(DENIED, None, (), None, "")
_NOTHING_DECIDED = LimitOutcome(ALLOWED, None, (), None, "")



class RequestState:
    """What the limiter carries through one request (`request.ratelimit`).

    `outcome`: what was decided (None until then), at `cost`; `slots`: the concurrency slots it holds
    until it ends; `deferred`: the (cost, scope) the middleware left to a framework's throttles;
    `in_flight`: this process' requests in flight when it arrived (None: the process shedder is off);
    `entry`: what an entry point carries from admit to finish, by a name of its own; `settings`: the
    snapshot it was admitted under (None before `admit`).
    """

    __slots__ = ("_closers", "cost", "deferred", "entry", "in_flight", "outcome", "settings", "slots")

    def __init__(self) -> None:
        self.outcome: LimitOutcome | None = None
        self.cost = 1
        self.slots: list[HeldSlots] = []
        self.deferred: tuple[int, str] | None = None
        self.in_flight: int | None = None
        self.entry: dict[str, Any] = {}
        self._closers: list[Callable[[], None]] = []
        self.settings: Snapshot | None = None

    def hold(self, slots: HeldSlots | None) -> None:
        """Hold `slots` until the request ends (`finish`, `end`)."""
        if slots is not None:
            self.slots.append(slots)

    def at_end(self, closer: Callable[[], None]) -> None:
        """Call `closer` (once, never raising) when the request ends: its response closed or dropped, or `end`."""
        self._closers.append(closer)

    def take_slots(self) -> list[HeldSlots]:
        slots, self.slots = self.slots, []
        return slots

    def take_closers(self) -> list[Callable[[], None]]:
        closers, self._closers = self._closers, []
        return closers

    def report_usage(self, unit: str, count: int) -> None:
        """Add `count` units of `unit` to what this request used (ratelimit_app.apply.usage): settled when
        it ends. Nothing happens for a unit it reserved nothing of."""
        meter = self.entry.get(USAGE_ENTRY)
        if meter is not None:
            meter.report(unit, count)

    def take_deferred(self) -> tuple[int, str] | None:
        deferred, self.deferred = self.deferred, None
        return deferred

    def __repr__(self) -> str:
        status = self.outcome.status if self.outcome is not None else "undecided"
        return f"RequestState({status}; {len(self.slots)} slot set(s) held)"


def state_of(request: HttpRequest) -> RequestState:
    """The request's state, made on first use."""
    state: RequestState | None = request.__dict__.get(_ATTRIBUTE)
    if state is None:
        state = request.__dict__[_ATTRIBUTE] = RequestState()
    return state


def state_if_any(request: Any) -> RequestState | None:
    """The request's state when it has one (None: nothing of ours has looked at it yet)."""
    state = getattr(request, "__dict__", {}).get(_ATTRIBUTE)
    return state if isinstance(state, RequestState) else None


def outcome_of(request: Any) -> LimitOutcome | None:
    state = state_if_any(request)
    return state.outcome if state is not None else None


def record(request: HttpRequest, outcome: LimitOutcome, cost: int = 1) -> HttpResponseBase | None:
    """Record `outcome` (decided at `cost`) on the request's state and hold its slots: the refusal to
    send, or None when it allows the request."""
    state = state_of(request)
    state.outcome = outcome
    state.cost = cost
    if outcome.slots is not None:
        state.slots.append(outcome.slots)
    return None if outcome.status == ALLOWED else refusal(outcome, cost)


def admit(request: HttpRequest, *, cost: int = 1, scope: str = "", extra: Extra = (), path: str | None = None,
          where: str = "middleware", usage: Usage = (), user: Any = FROM_REQUEST, throttles: Throttles | None = None,
          run: Callable[[Callable[[], LimitOutcome]], LimitOutcome] | None = None,
          answer: Answer = record) -> HttpResponseBase | None:
    """Plan and decide `request` at `cost` in `scope`, with the `extra` checks in the same call; hold the
    slots it took and `answer` the outcome (default `record`: the refusal to send (401, 403, 429, 503),
    or None when admitted). Never raises because of the limiter: a failure follows the fail mode (logged
    as from `where`); RATELIMIT['ENABLED'] = False admits without deciding anything.

    `path`: the path planned for (a gateway's described request; default the request's own). `usage`: the
    estimates it reserves (ratelimit_app.apply.usage), settled when it ends. `user`: the framework's
    authenticated user (default the request's). `throttles`: see `Throttles`. `run(decide_now)` runs the
    decision, and sees its errors before the fail mode does (Ninja's, which may be on an event loop).
    """
    check_mode(usage, throttles)
    settings = settings_of(request)
    try:  # RATELIMIT['ENABLED'] always has a reading (an invalid one reads as True)
        if not settings.enabled:
            outcome = NOT_LIMITED
        elif run is None:
            outcome = _decide(request, cost, scope, extra, path, usage, user, throttles, settings)
        else:
            outcome = run(lambda: _decide(request, cost, scope, extra, path, usage, user, throttles, settings))
    except Exception as exc:
        outcome = failure_outcome(exc, where, "")
    return answer(request, outcome, cost)


def _decide(request: HttpRequest, cost: int, scope: str, extra: Extra, path: str | None, usage: Usage, user: Any,
            throttles: Throttles | None, settings: Snapshot) -> LimitOutcome:
    if throttles is not None:
        throttled = throttled_plan(throttles, extra)
        if isinstance(throttled, LimitOutcome):
            return throttled
        if isinstance(throttled, RequestPlan):
            return decide(throttled, cost)
        extra = throttled
    if usage:
        outcome, meter = usage_limits.limit_request(request, cost=cost, scope=scope, usage=usage, extra=extra,
                                                    path=path, settings=settings, user=user)
        hold_usage(request, meter)
        return outcome
    return limit_request(request, cost=cost, scope=scope, user=user, extra=extra() if callable(extra) else extra,
                         path=path, settings=settings)


def check_mode(usage: Usage, throttles: Throttles | None) -> None:
    """Raise ValueError for `usage` with throttles decided alone: the estimates reserve the tier's usage
    limits, which such a decision never asks (a caller's mistake, not the limiter's failure)."""
    if usage and throttles is not None and not throttles.request_limits:
        raise ValueError("admit: usage reserves the tier's usage limits; throttles with request_limits=False "
                         "decide without them (pass usage only with the request's limits)")


def throttled_plan(throttles: Throttles, extra: Extra) -> LimitOutcome | RequestPlan | Sequence[LimitCheck]:
    """What `throttles` leave to decide (`admit`'s and `aadmit`'s): an outcome without asking anything, the
    plan of their checks and `extra` decided alone, or those checks, to decide with the request's own limits.
    Alone, the plan is shown to operators by the first check's label, else by a digest of its identity (a
    throttle's identity may hold anything)."""
    found = throttles.checks()
    if found is None:
        return REFUSED_OUTRIGHT
    checks, label = found
    checks = (*checks, *(extra() if callable(extra) else extra))
    if throttles.request_limits:
        return checks
    if not checks:
        return _NOTHING_DECIDED
    identity = checks[0].label or f"throttle:#{identity_digest(checks[0].identity)}"
    return RequestPlan(tuple(checks), None, identity, limit_config().fail_mode, label=label)


def hold_usage(request: HttpRequest, meter: usage_limits.UsageMeter | None) -> None:
    """Keep what `request` reserved (`meter`) until it ends, when it is settled."""
    if meter is not None:
        state = state_of(request)
        state.entry[USAGE_ENTRY] = meter
        state.at_end(meter.settle)


def settings_of(request: HttpRequest) -> Snapshot:
    """The settings snapshot `request` is limited under: the one of its arrival, taken on first use."""
    state = state_of(request)
    if state.settings is None:
        state.settings = request_settings()
    return state.settings


def finish(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    """`response` with the headers of the request's outcome; the slots it holds (and what `at_end`
    registered) go with it: released when it is closed (a stream: ended or cut off) or dropped."""
    state = request.__dict__.get(_ATTRIBUTE)
    if state is None:
        return response
    if state.outcome is not None:
        add_headers(response, state.outcome, state.settings)
        if USAGE_ENTRY in state.entry:
            usage_limits.finish(response, state.outcome, state.entry[USAGE_ENTRY], state.settings)
    if state.slots:
        for slots in state.take_slots():
            release_with(response, slots)
    if state._closers:
        for closer in state.take_closers():
            cast(Any, response)._resource_closers.append(closer)  # called by HttpResponseBase.close()
            weakref.finalize(response, closer)
    return response


def end(request: HttpRequest) -> None:
    """The request ended without a response (the view raised, a connection closed): give back what it holds."""
    state = state_if_any(request)
    if state is None:
        return
    for slots in state.take_slots():
        slots.release()
    for closer in state.take_closers():
        closer()
