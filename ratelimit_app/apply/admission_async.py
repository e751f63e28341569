"""The async twins of ratelimit_app.apply.admission (`aadmit`, `afinish`, `aend`): the same contract on the
event loop, over the same `RequestState`."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponseBase

from ..conf.snapshot import Snapshot
from ..core.engine import Usage
from . import limiting_async, planning_async, usage_async
from .admission import (
    USAGE_ENTRY,
    Answer,
    Extra,
    Throttles,
    check_mode,
    finish,
    hold_usage,
    record,
    settings_of,
    state_if_any,
    throttled_plan,
)
from .limiting import failure_outcome
from .outcome import NOT_LIMITED, LimitOutcome
from .planning import FROM_REQUEST, RequestPlan


async def aadmit(request: HttpRequest, *, cost: int = 1, scope: str = "", extra: Extra = (),
                 path: str | None = None, where: str = "middleware", usage: Usage = (), user: Any = FROM_REQUEST,
                 throttles: Throttles | None = None, answer: Answer = record) -> HttpResponseBase | None:
    """`admission.admit` on the event loop (`extra`, when a callable, and `throttles.checks` are called
    once the request's user is known)."""
    check_mode(usage, throttles)
    settings = settings_of(request)
    try:  # RATELIMIT['ENABLED'] always has a reading (an invalid one reads as True)
        if not settings.enabled:
            outcome = NOT_LIMITED
        else:
            outcome = await _adecide(request, cost, scope, extra, path, usage, user, throttles, settings)
    except Exception as exc:
        outcome = failure_outcome(exc, where, "")
    return answer(request, outcome, cost)


async def _adecide(request: HttpRequest, cost: int, scope: str, extra: Extra, path: str | None, usage: Usage,
                   user: Any, throttles: Throttles | None, settings: Snapshot) -> LimitOutcome:
    """`admission._decide`, awaited."""
    if throttles is not None:
        if user is FROM_REQUEST:
            await planning_async.request_user(request)  # the checks may read request.user
        throttled = throttled_plan(throttles, extra)
        if isinstance(throttled, LimitOutcome):
            return throttled
        if isinstance(throttled, RequestPlan):
            return await limiting_async.decide(throttled, cost)
        extra = throttled
    if usage:
        outcome, meter = await usage_async.limit_request(request, cost=cost, scope=scope, usage=usage, extra=extra,
                                                         path=path, settings=settings, user=user)
        hold_usage(request, meter)
        return outcome
    return await limiting_async.limit_request(request, cost=cost, scope=scope, user=user, extra=extra, path=path,
                                              settings=settings)


async def afinish(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    """`admission.finish` (nothing in it waits: the slots go back when the response is closed)."""
    return finish(request, response)


async def aend(request: HttpRequest) -> None:
    """`admission.end` on the event loop."""
    state = state_if_any(request)
    if state is None:
        return
    for slots in state.take_slots():
        await slots.arelease()
    meter = state.entry.get(USAGE_ENTRY)
    if meter is not None:
        await meter.asettle()  # on the event loop; its closer below then finds it settled
    for closer in state.take_closers():
        closer()
