"""The async twins of ratelimit_app.apply.usage: `decide` and `limit_request`, the decision that reserves
usage made through the async service on the event loop; the same plan (`usage.with_usage`) and meter."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from ..conf.snapshot import Snapshot
from ..core.engine import Usage
from ..core.usage import NO_RESERVATION, Reservation
from ..service.limiter_async import get_async_limiter
from . import limiting, limiting_async, planning_async
from .outcome import LimitOutcome
from .planning import FROM_REQUEST, RequestPlan
from .usage import UsageMeter, with_usage


async def decide(plan: RequestPlan, cost: int, usage: Usage) -> tuple[LimitOutcome, Reservation]:
    """`usage.decide`, the call made through the async service."""
    call = limiting.planned_call(plan, cost)
    if isinstance(call, LimitOutcome):
        return call, NO_RESERVATION
    decisions, reserved = await get_async_limiter().reserve_many(call.pairs, max(call.cost, 1), usage,
                                                                 fail_mode=plan.tier_fail_mode, lease=call.lease)
    outcome, unwanted = limiting.conclude(call._replace(cost=max(call.cost, 1)), decisions)
    if unwanted is not None:
        await unwanted.arelease()
    return outcome, reserved


async def limit_request(request: HttpRequest, *, cost: int, scope: str, usage: Usage, extra: Any = (),
                        path: str | None = None,
                        settings: Snapshot | None = None) -> tuple[LimitOutcome, UsageMeter | None]:
    """`usage.limit_request` on the event loop."""
    planned = await planning_async.plan_request(request, cost=cost, scope=scope, user=FROM_REQUEST, path=path,
                                                settings=settings)
    if isinstance(planned, LimitOutcome):
        return planned, None
    if not planned.refusal:
        planned = planned.plus(extra() if callable(extra) else extra)
    planned, usage = with_usage(planned, scope, usage)
    if not usage or planned.refusal:
        return await limiting_async.decide(planned, cost), None
    outcome, reserved = await decide(planned, cost, usage)
    return outcome, UsageMeter(reserved, planned.label) if reserved.held else None
