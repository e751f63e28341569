"""The async twin of ratelimit_app.apply.usage: `limit_request`, the decision that reserves usage made through
the async service on the event loop, over the same core (`reserving`, `reserving_call`, `metered`)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from ..conf.snapshot import Snapshot
from ..core.engine import Usage
from ..service.limiter_async import get_async_limiter
from . import limiting, limiting_async, planning_async
from .outcome import LimitOutcome
from .planning import FROM_REQUEST
from .usage import UsageMeter, metered, reserving, reserving_call


async def limit_request(request: HttpRequest, *, cost: int, scope: str, usage: Usage, extra: Any = (),
                        path: str | None = None, settings: Snapshot | None = None,
                        user: Any = FROM_REQUEST) -> tuple[LimitOutcome, UsageMeter | None]:
    """`usage.limit_request` on the event loop."""
    planned = await planning_async.plan_request(request, cost=cost, scope=scope, user=user, path=path,
                                                settings=settings)
    if isinstance(planned, LimitOutcome):
        return planned, None
    plan, usage = reserving(planned, scope, usage, extra)
    if not usage:
        return await limiting_async.decide(plan, cost), None
    call = reserving_call(plan, cost)
    if isinstance(call, LimitOutcome):
        return call, None
    decisions, reserved = await get_async_limiter().reserve_many(call.pairs, call.cost, usage,
                                                                 fail_mode=plan.tier_fail_mode, lease=call.lease)
    outcome, unwanted = limiting.conclude(call, decisions)
    if unwanted is not None:
        await unwanted.arelease()
    return outcome, metered(plan, reserved)
