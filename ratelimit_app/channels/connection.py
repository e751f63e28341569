"""One WebSocket connection's limits, from its connect to its disconnect: `ConnectionLimits`.

- The connect is admitted like a request to the connect scope (the tier's limits, the scope's own, such
  as "5 connects per minute" and "2 connections at once", and the per-IP limit, in one Redis call).
- A concurrency limit of that scope gives the connection a slot, held for its whole life: renewed every
  third of its lease while the connection lives, given back when it ends, and given back by its lease
  when the server dies.
- Each received message is charged to the message scope's own limits (not the tier's HTTP limits), with
  its cost, for the identity and tier found at connect: one Redis call, answered from the deny cache
  while a refusal's retry time lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponseBase

from ..apply import limiting_async
from ..apply.concurrency import HeldSlots
from ..apply.limitcheck import LimitCheck
from ..apply.outcome import LimitOutcome
from ..apply.planning import RequestPlan, limit_config
from ..apply.responses import refusal
from ..core.policies import CONCURRENCY, Policy
from ..plans.compile import TierInfo


def own_policies(tier: TierInfo | None, scope: str) -> tuple[Policy, ...]:
    """The limits `tier` sets for `scope` alone (`TierInfo.scoped` holds the unscoped ones first)."""
    if tier is None or scope not in tier.scoped:
        return ()
    return tier.scoped[scope][len(tier.policies):]


class ConnectionLimits:
    """What one connection holds: who it is (`outcome`, from its connect), its slots, its refused messages."""

    def __init__(self, request: HttpRequest, *, connect_scope: str, message_scope: str) -> None:
        self.request = request
        self.connect_scope = connect_scope
        self.message_scope = message_scope
        self.outcome: LimitOutcome | None = None
        self.slots: HeldSlots | None = None
        self.refused = 0
        #: What a message costs, from its text and bytes (set by RateLimitedConsumerMixin); None: 1 each.
        self.cost_of: Callable[[str | None, bytes | None], int] | None = None
        self._message_plan: RequestPlan | None = None
        self._renewal: asyncio.Task[None] | None = None

    async def connect(self) -> HttpResponseBase | None:
        """Admit the connect: None when admitted (its slots held and renewed), else the refusal to answer."""
        request, scope = self.request, self.connect_scope
        outcome = await limiting_async.safely(lambda: limiting_async.limit_request(request, scope=scope),
                                              where="websocket connect")
        self.outcome = outcome
        if not outcome.allowed:
            if outcome.slots is not None:
                await outcome.slots.arelease()
            return refusal(outcome)
        self.slots = outcome.slots
        if self.slots is not None:
            self._renewal = asyncio.create_task(_renew(self.slots))
        policies = own_policies(outcome.tier, self.message_scope)
        if policies and outcome.tier is not None:
            tier = outcome.tier
            mode = tier.fail_mode or limit_config().fail_mode
            self._message_plan = RequestPlan((LimitCheck(outcome.identity, policies),), tier, outcome.identity,
                                             mode, tier.fail_mode, label=tier.slug)
        return None

    def message_cost(self, event: dict[str, Any]) -> int:
        """The cost of the received message `event` (`cost_of`, else 1)."""
        cost_of = self.cost_of
        return 1 if cost_of is None else int(cost_of(event.get("text"), event.get("bytes")))

    async def message(self, cost: int = 1) -> LimitOutcome | None:
        """Charge one received message `cost` units of the message scope: None when admitted (or when no
        limit applies), else the refused outcome (counted in `refused`)."""
        plan = self._message_plan
        if plan is None or cost <= 0:
            return None
        outcome = await limiting_async.safely(lambda: limiting_async.decide(plan, cost), where="websocket message",
                                              identity=plan.identity)
        if outcome.allowed:
            return None
        self.refused += 1
        return outcome

    async def end(self) -> None:
        """The connection ended: stop renewing and give its slots back (once; never raises)."""
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(BaseException):
                await self._renewal
            self._renewal = None
        if self.slots is not None:
            await self.slots.arelease()


def _lease_seconds(slots: HeldSlots) -> float:
    return min(policy.period for _, policy in slots.held if policy.algorithm == CONCURRENCY)


async def _renew(slots: HeldSlots) -> Any:
    """Keep `slots` held: a full lease again every third of the shortest one, until cancelled or lost."""
    interval = max(_lease_seconds(slots) / 3, 0.05)
    while not slots.released:
        await asyncio.sleep(interval)
        if await slots.arenew() is False:  # the lease ran out (Redis lost it, or a long stall): nothing to keep
            return
