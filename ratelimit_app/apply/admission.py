"""The admission path every entry point is an adapter over: `admit` a request (plan, one all-or-nothing
decision, the slots it took held, the outcome recorded), then `finish` its response (headers, the held
slots tied to the response's end), or `end` it when it ends without one. What the limiter carries
through a request is one `RequestState`, in `request.ratelimit`. The async twins are in
ratelimit_app.apply.admission_async.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

from django.http import HttpRequest, HttpResponseBase

from ..conf.snapshot import Snapshot, request_settings
from ..core.engine import Usage
from . import usage as usage_limits
from .concurrency import HeldSlots, middleware_installed, release_with
from .limitcheck import LimitCheck
from .limiting import failure_outcome, limit_request
from .outcome import ALLOWED, NOT_LIMITED, LimitOutcome
from .responses import add_headers, refusal

#: The one request attribute of ours.
_ATTRIBUTE = "ratelimit"

#: The name under which a request's state holds what it reserved (ratelimit_app.apply.usage.UsageMeter).
USAGE_ENTRY = "usage"
#: The extra checks of `admit`: a sequence, or a callable giving it once the request's user is known.
Extra = Sequence[LimitCheck] | Callable[[], Sequence[LimitCheck]]


class RequestState:
    """What the limiter carries through one request (`request.ratelimit`).

    `outcome` is what was decided (None until a decision is made); `cost` what the request was charged
    at; `slots` the concurrency slots it holds until it ends; `deferred` the (cost, scope) an entry point
    left to a framework's throttles to decide; `in_flight` this process' requests in flight when it
    arrived (the process shedder's count, None when that shedder is off); `entry` what an entry point
    carries from admit to finish, by a name of its own; `settings` the settings snapshot the request was
    admitted under (None before `admit`).
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
        """The held slots, no longer held here (whoever takes them gives them back)."""
        slots, self.slots = self.slots, []
        return slots

    def take_closers(self) -> list[Callable[[], None]]:
        """What `at_end` registered, no longer registered here."""
        closers, self._closers = self._closers, []
        return closers

    def report_usage(self, unit: str, count: int) -> None:
        """Add `count` units of `unit` to what this request used (ratelimit_app.apply.usage): settled when
        it ends. Nothing happens for a unit it reserved nothing of."""
        meter = self.entry.get(USAGE_ENTRY)
        if meter is not None:
            meter.report(unit, count)

    def take_deferred(self) -> tuple[int, str] | None:
        """The (cost, scope) left to a framework's throttles, once."""
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
    """What was decided for `request` (None when nothing was)."""
    state = state_if_any(request)
    return state.outcome if state is not None else None


def admit(request: HttpRequest, *, cost: int = 1, scope: str = "", extra: Extra = (),
          path: str | None = None, where: str = "middleware", usage: Usage = ()) -> HttpResponseBase | None:
    """Plan and decide `request` at `cost` in `scope`, with the `extra` checks in the same call; hold
    the slots it took and record the outcome on its state. `path`: the path planned for (a gateway's
    described request; default the request's own). The refusal to send (401, 403, 429, 503),
    or None when admitted. Never raises because of the limiter: a failure follows the fail mode
    (logged as from `where`); RATELIMIT['ENABLED'] = False admits without deciding anything. `usage`:
    the estimates it reserves (ratelimit_app.apply.usage), settled when it ends."""
    settings = settings_of(request)
    try:  # RATELIMIT['ENABLED'] always has a reading (an invalid one reads as True)
        if not settings.enabled:
            outcome = NOT_LIMITED
        elif usage:
            outcome, meter = usage_limits.limit_request(request, cost=cost, scope=scope, usage=usage, extra=extra,
                                                        path=path, settings=settings)
            hold_usage(request, meter)
        else:
            outcome = limit_request(request, cost=cost, scope=scope, extra=extra() if callable(extra) else extra,
                                    path=path, settings=settings)
    except Exception as exc:
        outcome = failure_outcome(exc, where, "")
    return record(request, outcome, cost)


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


def record(request: HttpRequest, outcome: LimitOutcome, cost: int = 1) -> HttpResponseBase | None:
    """Record `outcome` (decided at `cost`) on the request's state and hold its slots: the refusal to
    send, or None when it allows the request."""
    state = state_of(request)
    state.outcome = outcome
    state.cost = cost
    if outcome.slots is not None:
        state.slots.append(outcome.slots)
    return None if outcome.status == ALLOWED else refusal(outcome, cost)


def finish(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    """`response` with the rate limit headers of the request's outcome; the slots it holds (and what
    `at_end` registered) go with the response, released when it is closed (a stream: when it ends or
    is cut off) or dropped unclosed."""
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
    """The request ended without a response to carry its end (the view raised, a connection closed):
    give back what it holds now."""
    state = state_if_any(request)
    if state is None:
        return
    for slots in state.take_slots():
        slots.release()
    for closer in state.take_closers():
        closer()


def release_after(request: HttpRequest, result: Any, slots: HeldSlots | None) -> None:
    """Give `slots` back once the view's `result` is done with: with the response when `result` is one;
    when it is data that a framework turns into the response later (a Django Ninja operation returns a
    dict or a model), with the response RateLimitMiddleware finishes, or at once when the middleware
    is not installed (the view's own work is over)."""
    if slots is None:
        return
    if isinstance(result, HttpResponseBase):
        release_with(result, slots)
    elif middleware_installed():
        state_of(request).hold(slots)
    else:
        slots.release()
