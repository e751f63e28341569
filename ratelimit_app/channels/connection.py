"""One WebSocket connection's limits, from its connect to its disconnect (docs/websockets.md, "The limits,
per tier"): the connect admitted like a request (`aadmit`), its concurrency slot renewed while it lives,
each message charged to the message scope's own limits alone (its connect paid the tier's HTTP limits and
the per-IP limit), planned again after an edit of the plans."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponseBase

from ..apply import limiting_async, planning_async
from ..apply.admission import outcome_of, state_if_any
from ..apply.admission_async import aadmit, aend
from ..apply.concurrency import HeldSlots
from ..apply.limitcheck import LimitCheck
from ..apply.outcome import LimitOutcome
from ..apply.planning import RequestPlan, limit_config
from ..core.policies import CONCURRENCY, Policy
from ..plans.compile import TierInfo
from ..plans.lookups import get_lookups


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
        self.refused = 0
        #: What a message costs, from its text and bytes (set by RateLimitedConsumerMixin); None: 1 each.
        self.cost_of: Callable[[str | None, bytes | None], int] | None = None
        self._message_plan: RequestPlan | None = None
        self._plans_seen = (0, 0)
        self._renewal: asyncio.Task[None] | None = None

    async def connect(self) -> HttpResponseBase | None:
        """Admit the connect: None when admitted (its slots held and renewed), else the refusal to answer."""
        refused = await aadmit(self.request, scope=self.connect_scope, where="websocket connect")
        outcome = self.outcome = outcome_of(self.request)
        if refused is not None or outcome is None:
            await aend(self.request)
            return refused
        state = state_if_any(self.request)
        if state is not None and state.slots:
            self._renewal = asyncio.create_task(_renew(list(state.slots)))
        self._plan_messages(outcome.tier, outcome.identity)
        return None

    def _plan_messages(self, tier: TierInfo | None, identity: str) -> None:
        """The plan of this connection's messages: the message scope's own limits of `tier` for `identity`."""
        self._plans_seen = _plans_version()
        policies = own_policies(tier, self.message_scope)
        if not policies or tier is None:
            self._message_plan = None
            return
        mode = tier.fail_mode or limit_config().fail_mode
        self._message_plan = RequestPlan((LimitCheck(identity, policies),), tier, identity, mode, tier.fail_mode,
                                         label=tier.slug)

    async def _replan(self) -> None:
        """Plan the client again after an edit of the plans (its tier, its key's limits, its key revoked)."""
        try:
            planned = await planning_async.plan_request(self.request, scope=self.message_scope)
        except Exception:  # the messages keep the plan they had; the next edit plans them again
            planned = None
        if isinstance(planned, RequestPlan) and not planned.refusal:
            self._plan_messages(planned.tier, planned.identity)
        else:  # refused (a key revoked since): the connection keeps the limits it has until it closes
            self._plans_seen = _plans_version()

    def message_cost(self, event: dict[str, Any]) -> int:
        """The cost of the received message `event` (`cost_of`, else 1)."""
        cost_of = self.cost_of
        return 1 if cost_of is None else int(cost_of(event.get("text"), event.get("bytes")))

    async def message(self, cost: int = 1) -> LimitOutcome | None:
        """Charge one received message `cost` units of the message scope: None when admitted (or when no
        limit applies), else the refused outcome (counted in `refused`)."""
        if self._plans_seen != _plans_version() and self.outcome is not None and self.outcome.tier is not None:
            await self._replan()
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
        """The connection ended: stop renewing and give its slots back (`aend`: once; never raises)."""
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(BaseException):
                await self._renewal
            self._renewal = None
        await aend(self.request)


def _plans_version() -> tuple[int, int]:
    """Changes when this process learns of an edit of the plans (announced by any process, or its own)."""
    lookups = get_lookups()
    return lookups.edits.changes, lookups.local.generation


async def _renew(held: list[HeldSlots]) -> Any:
    """Keep the slots of `held` taken: a full lease again every third of the shortest one, until cancelled
    or given back."""
    lease = min(policy.period for slots in held for _, policy in slots.held if policy.algorithm == CONCURRENCY)
    interval = max(lease / 3, 0.05)
    while True:
        await asyncio.sleep(interval)
        live = [slots for slots in held if not slots.released]
        if not live:
            return
        for slots in live:
            await slots.arenew()  # False: its lease ran out (a long stall); None: Redis did not answer
