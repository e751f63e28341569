"""`RateLimitMiddleware`: the admission path (ratelimit_app.apply.admission) for every request under
RATELIMIT['PATH_PREFIXES'], WSGI and ASGI: admitted in `process_view`, once the view is known; charged on
the way out when no view decided; every response finished (headers, slots given back when it is closed).
The process shedder counts requests in flight here. What a project sees of it: docs/usage.md.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.http import HttpRequest, HttpResponseBase

from .apply import shedding
from .apply import usage as usage_limits
from .apply.admission import Extra, admit, end, finish, settings_of, state_if_any, state_of
from .apply.admission_async import aadmit, aend, afinish
from .apply.concurrency import call_later
from .apply.identity import request_ip_identity
from .apply.outcome import SHED, LimitOutcome
from .apply.planning import path_scope
from .apply.responses import overloaded
from .apply.routes import ViewRoute, joined_checks, route_of
from .conf.settings import InvalidSetting
from .conf.snapshot import request_settings
from .core.engine import Usage
from .service import events


class RateLimitMiddleware:
    """Identify, limit and annotate API requests. Under ASGI it is a coroutine and so is its
    `process_view`: Django runs both on the event loop, where the decision is awaited."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
            # Django runs a view middleware method on the loop only when it is a coroutine function
            self.process_view = self.aprocess_view  # type: ignore[method-assign,assignment]

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        _arrive(request)
        try:
            response = self.get_response(request)
        except BaseException:
            end(request)  # the view raised: no response will be closed
            raise
        late = _late_charge(request)
        if late is not None:
            response = admit(request, cost=late[0], scope=late[1]) or response
        return finish(request, response)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        _arrive(request)
        try:
            response = await self.get_response(request)
        except asyncio.CancelledError:
            await _after_the_work(request)  # the client went away: see _after_the_work
            raise
        except BaseException:
            await aend(request)
            raise
        late = _late_charge(request)
        if late is not None:
            response = await aadmit(request, cost=late[0], scope=late[1]) or response
        return await afinish(request, response)

    def process_view(self, request: HttpRequest, view_func: Callable[..., Any], view_args: Any,
                     view_kwargs: Any) -> HttpResponseBase | None:
        charge = _charge_of(request, view_func)
        if not isinstance(charge, _Charge):
            return charge
        return admit(request, cost=charge.cost, scope=charge.scope, extra=charge.extra, usage=charge.usage)

    async def aprocess_view(self, request: HttpRequest, view_func: Callable[..., Any], view_args: Any,
                            view_kwargs: Any) -> HttpResponseBase | None:
        charge = _charge_of(request, view_func)
        if not isinstance(charge, _Charge):
            return charge
        return await aadmit(request, cost=charge.cost, scope=charge.scope, extra=charge.extra, usage=charge.usage)


class _Charge(NamedTuple):
    """What the middleware charges a request once its view is known: the route's cost and scope, the view's
    own checks decided in the same call (`@ratelimit`, `@limit_concurrency`) and the usage it reserves."""

    cost: int
    scope: str
    extra: Extra
    usage: Usage


def _charge_of(request: HttpRequest, view_func: Callable[..., Any]) -> _Charge | HttpResponseBase | None:
    """What to charge before the view runs; or the process shedder's 503, or the 400 of a usage estimate
    that could not be made; or None when the middleware decides nothing here (a path it does not limit,
    or a view whose throttles of ours decide). The declarations read are those of the handler the
    request reaches (`resolve_view`)."""
    state = state_of(request)
    if state.in_flight is not None:  # the process shedder counts this request
        shed = _process_shed(request, route_of(view_func, request), state.in_flight)
        if shed is not None:
            return shed
    if not path_scope(state.settings).applies(request.path_info):
        return None
    found = route_of(view_func, request)
    if found.deferred:
        state.deferred = (found.cost, found.route.scope)
        return None
    usage: Usage = ()
    estimators = usage_limits.estimators_of(view_func)
    if estimators is not None and settings_of(request).enabled:
        estimated = usage_limits.estimate(request, estimators)
        if not isinstance(estimated, tuple):
            return estimated  # the estimate could not be made: 400
        usage = estimated
    # the view's checks are given once the request's user is known (a key function may read it)
    extra = () if found.view_limit is None else functools.partial(joined_checks, found.view_limit, request,
                                                                  found.cost)
    return _Charge(found.cost, found.route.scope, extra, usage)


def _late_charge(request: HttpRequest) -> tuple[int, str] | None:
    """(cost, scope) to charge on the way out when no decision was made before the view: the URL
    resolved to no view, an earlier middleware answered, or DRF refused the request before its
    throttles ran. None when a decision was made or the path is not limited."""
    state = state_if_any(request)
    if state is not None:
        if state.outcome is not None:
            return None
        deferred = state.take_deferred()
        if deferred is not None:
            return max(deferred[0], 1), deferred[1]
    return (1, "") if path_scope(state_of(request).settings).applies(request.path_info) else None


async def _after_the_work(request: HttpRequest) -> None:
    """Give back what a cancelled request holds once the work it was admitted for has ended: asgiref raises
    CancelledError at once while a sync view goes on in the request's thread, so a call queued on that
    thread (thread-sensitive) runs only once the view has returned. Cancelled again meanwhile, the slots go
    back from the releasing thread when that call has run."""
    ended = asyncio.ensure_future(sync_to_async(_nothing, thread_sensitive=True)())
    try:
        await asyncio.shield(ended)
    except asyncio.CancelledError:
        ended.add_done_callback(lambda _: _leave(request))
        raise
    await aend(request)


def _nothing() -> None:
    """Returns, in a request's thread, once the work queued there before it has ended."""


def _leave(request: HttpRequest) -> None:
    """`end` from a callback on the event loop: the slots go back, and the closers run (a usage settlement
    is a blocking Redis call), from the releasing thread."""
    state = state_if_any(request)
    if state is None:
        return
    for slots in state.take_slots():
        call_later(slots.release)
    for closer in state.take_closers():
        call_later(closer)


def _arrive(request: HttpRequest) -> None:
    """Give `request` its state, under the settings of now; count it in this process' requests in flight
    when the process shedder is on, until it ends."""
    state = state_of(request)
    state.settings = request_settings()
    try:
        process_limit = shedding.shed_config(state.settings).process_limit
    except InvalidSetting:
        # a shedding setting with no reading: no shedder runs (the requests the middleware limits, whose
        # decision reads the same settings, follow the fail mode)
        return
    if process_limit is None:
        return
    state.in_flight = shedding.in_flight.enter()
    state.at_end(shedding.Departure())


def _process_shed(request: HttpRequest, found: ViewRoute, count: int) -> HttpResponseBase | None:
    """503 for a low-priority request while this process has more than SHED_PROCESS_LIMIT requests in
    flight (`count`, this one included; no Redis call), else None."""
    try:
        config = shedding.shed_config(state_of(request).settings)
        priority = config.priority_for(request.path_info, found.route.priority)
        if not shedding.process_sheds(config, priority, count):
            if priority == shedding.LOW:
                shedding.process_episode.record_admitted()
            return None
        identity = request_ip_identity(request)
        events.record_decision(allowed=False, tier="process", policy=f"process-shed.{priority}", degraded=False,
                                identity=identity)
        shedding.process_episode.record_shed(priority, {"in_flight": count, "limit": config.process_limit})
        # refused before any decision: nothing is charged for it on the way out either (see _late_charge)
        state_of(request).outcome = LimitOutcome(SHED, None, (), None, identity, priority, charged=False)
        return overloaded(priority, config.retry_after)
    except Exception:  # the shedder never fails a request
        return None

