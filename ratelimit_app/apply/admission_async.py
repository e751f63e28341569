"""The async twins of ratelimit_app.apply.admission (`aadmit`, `afinish`, `aend`, `arelease_after`): the
same contract on the event loop, over the same `RequestState`. Throttles (admit's `throttles=` mode) are
asked synchronously by every framework, so it has no twin here."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponseBase

from ..core.engine import Usage
from . import limiting_async, usage_async
from .admission import USAGE_ENTRY, Extra, finish, hold_usage, record, release_after, settings_of, state_if_any
from .concurrency import HeldSlots, middleware_installed
from .limiting import failure_outcome
from .outcome import NOT_LIMITED


async def aadmit(request: HttpRequest, *, cost: int = 1, scope: str = "", extra: Extra = (),
                 path: str | None = None, where: str = "middleware", usage: Usage = ()) -> HttpResponseBase | None:
    """`admission.admit` on the event loop (`extra`, when a callable, is called once the request's user
    is known)."""
    settings = settings_of(request)
    try:  # RATELIMIT['ENABLED'] always has a reading (an invalid one reads as True)
        if not settings.enabled:
            outcome = NOT_LIMITED
        elif usage:
            outcome, meter = await usage_async.limit_request(request, cost=cost, scope=scope, usage=usage,
                                                             extra=extra, path=path, settings=settings)
            hold_usage(request, meter)
        else:
            outcome = await limiting_async.limit_request(request, cost=cost, scope=scope, extra=extra, path=path,
                                                         settings=settings)
    except Exception as exc:
        outcome = failure_outcome(exc, where, "")
    return record(request, outcome, cost)


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


async def arelease_after(request: HttpRequest, result: Any, slots: HeldSlots | None) -> None:
    """`admission.release_after` on the event loop."""
    if slots is None:
        return
    if isinstance(result, HttpResponseBase) or middleware_installed():
        release_after(request, result, slots)
    else:
        await slots.arelease()
