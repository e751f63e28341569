"""`RateLimitMiddleware`: the admission path (ratelimit_app.apply.admission) for every request under
RATELIMIT['PATH_PREFIXES'], WSGI and ASGI.

It admits a request in `process_view`, once the view and its declarations are known (a view whose
throttles of ours decide is left to them), charges on the way out a limited request no view decided
(a 404, an earlier middleware's answer), and finishes every response (headers; slots given back when
it is closed, or at once when the view raised). The process shedder counts requests in flight here.
What a project sees of it is in docs/usage.md (sections 3, 4 and 10).
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
from .apply.concurrency import release_later
from .apply.identity import request_ip_identity
from .apply.outcome import SHED, LimitOutcome
from .apply.planning import path_scope
from .apply.responses import overloaded
from .apply.routes import ViewRoute, joined_checks, route_of
from .conf.settings import InvalidSetting
from .conf.snapshot import request_settings
from .service import events


class RateLimitMiddleware:
    """Identify, limit and annotate API requests over the admission path (see the module docstring).

    Sync and async capable: under WSGI it runs as a sync middleware; under ASGI it is a coroutine,
    and its `process_view` is one too, so Django runs both on the event loop and the decision is
    awaited there (`limiting_async.limit_request`), with no thread hop for a warm request.
    """

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
        limits = _view_limits(request, view_func)
        if not isinstance(limits, _ViewLimits):
            return limits
        usage = limits.usage_of(request)
        if not isinstance(usage, tuple):
            return usage  # the estimate could not be made: 400
        return admit(request, cost=limits.cost, scope=limits.scope, extra=limits.checks_for(request), usage=usage)

    async def aprocess_view(self, request: HttpRequest, view_func: Callable[..., Any], view_args: Any,
                            view_kwargs: Any) -> HttpResponseBase | None:
        """`process_view` under ASGI (the decision awaited on the event loop)."""
        limits = _view_limits(request, view_func)
        if not isinstance(limits, _ViewLimits):
            return limits
        usage = limits.usage_of(request)
        if not isinstance(usage, tuple):
            return usage
        return await aadmit(request, cost=limits.cost, scope=limits.scope, extra=limits.checks_for(request),
                            usage=usage)


class _ViewLimits(NamedTuple):
    """What the middleware charges a request once its view is known: the route's cost and scope, and
    the view's own limit (`@ratelimit`, `@limit_concurrency`) when it is decided in the same call."""

    cost: int
    scope: str
    view_limit: Any
    estimators: Any = None

    def usage_of(self, request: HttpRequest) -> tuple[tuple[str, int], ...] | HttpResponseBase:
        """The usage the view estimates for `request` (ratelimit_app.apply.usage), or its 400."""
        if self.estimators is None or not settings_of(request).enabled:
            return ()
        return usage_limits.estimate(request, self.estimators)

    def checks_for(self, request: HttpRequest) -> Extra:
        """The view's own checks for `request`, given once the request's user is known (a key function
        may read it), when the view's limit joins the request's limits at this cost."""
        if self.view_limit is None:
            return ()
        return functools.partial(joined_checks, self.view_limit, request, self.cost)


def _view_limits(request: HttpRequest, view_func: Callable[..., Any]) -> _ViewLimits | HttpResponseBase | None:
    """What to charge before the view runs; or the process shedder's 503; or None when the middleware
    decides nothing here (a path it does not limit, or a view whose throttles of ours decide). The
    declarations read are those of the handler the request reaches (`resolve_view`)."""
    state = state_of(request)
    if state.in_flight is not None:  # the process shedder counts this request
        shed = _process_shed(request, route_of(view_func, request), state.in_flight)
        if shed is not None:
            return shed
    if not _applies(request):
        return None
    found = route_of(view_func, request)
    if found.deferred:
        state_of(request).deferred = (found.cost, found.route.scope)
        return None
    return _ViewLimits(found.cost, found.route.scope, found.view_limit, usage_limits.estimators_of(view_func))


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
    return (1, "") if _applies(request) else None


async def _after_the_work(request: HttpRequest) -> None:
    """Give back the slots of a cancelled request, and take it out of this process' count, once the
    work it was admitted for has ended.

    Django cancels a request whose client disconnected; asgiref then raises CancelledError at once,
    while a sync view goes on in the request's thread. A call queued on that same thread
    (thread-sensitive: one thread per request, first come first served) runs only once the view has
    returned: the slots are held until then. If this task is cancelled again meanwhile, the slots go
    back from the releasing thread when that call has run.
    """
    ended = asyncio.ensure_future(sync_to_async(_nothing, thread_sensitive=True)())
    try:
        await asyncio.shield(ended)
    except asyncio.CancelledError:
        ended.add_done_callback(lambda _: _leave(request))
        raise
    await aend(request)


def _nothing() -> None:
    """Run in a request's thread: returns once the work queued there before it has ended."""


def _leave(request: HttpRequest) -> None:
    """`end` from a callback on the event loop: the slots go back from the releasing thread."""
    state = state_if_any(request)
    if state is None:
        return
    for slots in state.take_slots():
        release_later(slots)
    for closer in state.take_closers():
        closer()


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


def _applies(request: HttpRequest) -> bool:
    """True when the middleware limits this request's path (see `planning.path_scope`)."""
    return path_scope(state_of(request).settings).applies(request.path_info)
