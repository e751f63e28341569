"""The async twin of ratelimit_app.apply.limiting (`limit_request`, `decide`, `safely`, awaited on the event
loop): the same plan and reading of the reply, the call made through the async service, with no blocking
work and no thread hop for a warm request."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from django.http import HttpRequest

from ..conf.snapshot import Snapshot, request_settings
from ..service.limiter_async import get_async_limiter
from . import planning_async
from .limitcheck import LimitCheck
from .limiting import conclude, failure_outcome, planned_call, report_charge, report_peeks
from .outcome import NOT_LIMITED, LimitOutcome
from .planning import FROM_REQUEST, RequestPlan


async def decide(plan: RequestPlan, cost: int) -> LimitOutcome:
    """`limiting.decide`, the call made through the async service."""
    call = planned_call(plan, cost)
    if isinstance(call, LimitOutcome):
        return call
    service = get_async_limiter()
    if call.cost:
        decisions = await service.hit_many(call.pairs, call.cost, fail_mode=plan.tier_fail_mode, lease=call.lease)
    else:
        charged = report_charge(call)
        decisions = [await service.hit(*charged, 1, fail_mode=plan.tier_fail_mode)] if charged else []
        decisions += [await service.peek(identity, policies, fail_mode=plan.fail_mode, fresh=True)
                      for identity, policies in report_peeks(call, decisions)]
    outcome, unwanted = conclude(call, decisions)
    if unwanted is not None:
        await unwanted.arelease()
    return outcome


async def limit_request(request: HttpRequest, *, cost: int = 1, scope: str = "", user: Any = FROM_REQUEST,
                        extra: Sequence[LimitCheck] | Callable[[], Sequence[LimitCheck]] = (),
                        path: str | None = None, settings: Snapshot | None = None) -> LimitOutcome:
    """`limiting.limit_request` on the event loop: `planning_async.plan_request` then `decide`. `extra` may
    be a callable that gives the extra checks, called once the request's user is known (a key function
    may read `request.user`)."""
    planned = await planning_async.plan_request(request, cost=cost, scope=scope, user=user, path=path,
                                                 settings=settings)
    if isinstance(planned, LimitOutcome):
        return planned
    if planned.refusal:
        return await decide(planned, cost)
    return await decide(planned.plus(extra() if callable(extra) else extra), cost)


async def safely(limit: Callable[[], Awaitable[LimitOutcome]], *, where: str, identity: str = "") -> LimitOutcome:
    """`limiting.safely` for coroutines: `await limit()` (not when RATELIMIT['ENABLED'] is False), or the
    answer of the fail mode if it raises."""
    try:
        if not request_settings().enabled:  # always readable (an invalid one reads as True)
            return NOT_LIMITED
        return await limit()
    except Exception as exc:
        return failure_outcome(exc, where, identity)
