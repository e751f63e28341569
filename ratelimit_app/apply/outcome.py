"""What limiting decided for one request (`LimitOutcome`) and its status values: the answer the
middleware, the DRF throttles and `@ratelimit` turn into HTTP (200, 401, 403, 429 or 503)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..core.decision import Decision, PolicyResult
from ..core.policies import Policy
from ..plans.compile import TierInfo
from .concurrency import HeldSlots
from .limitcheck import LimitCheck

ALLOWED = "allowed"
DENIED = "denied"  # 429
UNAVAILABLE = "unavailable"  # 503: denied because the limiter is unavailable (fail mode)
UNAUTHORIZED = "unauthorized"  # 401
FORBIDDEN = "forbidden"  # 403: the client is deny-listed (ClientRule)
SHED = "shed"  # 503: refused by the load shedder (too many requests in flight)

#: Tier label of decisions made on the per-IP limit alone (no valid key or tier yet).
IP_ONLY_TIER = "ip"


class LimitOutcome(NamedTuple):
    """What limiting decided for one request.

    `status`: one of the values above; `message` says why for "unauthorized", and is the request's priority
    for "shed". `decision` summarises every policy checked (when denied: the policy that refused; None when
    nothing was decided); `policies` are those the `RateLimit-Policy` header shows. `identity` is a display
    label, never a full key. `charged` is False for report-only routes (cost 0). `checks` and `decisions`
    (same order; None where Redis Cluster stopped at the first denial) let each throttle or decorator read
    its own part. `slots`: the concurrency slots the request took (None: none), given back when its
    response is finished.
    """

    status: str
    decision: Decision | None
    policies: tuple[Policy, ...]
    tier: TierInfo | None
    identity: str
    message: str = ""
    charged: bool = True
    checks: tuple[LimitCheck, ...] = ()
    decisions: tuple[Decision | None, ...] = ()
    slots: HeldSlots | None = None

    @property
    def allowed(self) -> bool:
        """True when the request may proceed."""
        return self.status == ALLOWED

    @property
    def tier_slug(self) -> str | None:
        """The slug of the tier, or None when none was established."""
        return self.tier.slug if self.tier is not None else None

    def owns(self, owner: str) -> bool:
        """True when this outcome decided checks of `owner`."""
        return any(check.owner == owner for check in self.checks)

    def decision_for(self, owner: str) -> Decision | None:
        """The decision over the checks of `owner` alone (None when it had none). It allows when
        those limits allow, even if another check refused the request (which then charged nothing)."""
        mine = [d for check, d in zip(self.checks, self.decisions, strict=True) if check.owner == owner]
        if not mine:
            return None
        if any(d is None for d in mine):
            return self.decision  # Redis Cluster stopped at an earlier denial: this part was never decided
        return summarize([_as_its_own(d) for d in mine if d is not None], len(mine))


def _as_its_own(decision: Decision) -> Decision:
    """`decision` as its own policies decided it: one the call refused only because another check
    refused (every result of its own allows; see core.decision.all_or_nothing) allows again."""
    if decision.allowed or not decision.results or not all(result.allowed for result in decision.results):
        return decision
    return Decision.from_results(decision.results, degraded=decision.degraded, shadow=decision.shadow)


#: The outcome of a request that no limit of ours limits: its view's key function said so, or
#: RATELIMIT['ENABLED'] is False (`limiting.safely`). Nothing was decided, so it carries no headers.
NOT_LIMITED = LimitOutcome(ALLOWED, None, (), None, "")


def summarize(decisions: Sequence[Decision], expected: int) -> Decision:
    """One decision over several identities' decisions: denied if any is (or if some are missing, as
    on Redis Cluster after the first denial); `results` holds every policy's result, in order."""
    results: tuple[PolicyResult, ...] = ()
    shadow: tuple[PolicyResult, ...] = ()
    degraded = False
    denied: list[Decision] = []
    # the allowed decision nearest to refusing: each one describes its own tightest result (the rule of
    # Decision.from_results), so the rule over them gives that of every result, with no second pass
    tightest: Decision | None = None
    for decision in decisions:  # one pass: this runs on every request
        results += decision.results
        shadow += decision.shadow
        degraded = degraded or decision.degraded
        if not decision.allowed:
            denied.append(decision)
        elif decision.results and (tightest is None or decision.remaining < tightest.remaining or (
                decision.remaining == tightest.remaining and decision.reset_after > tightest.reset_after)):
            tightest = decision
    if not denied and len(decisions) == expected:
        if len(decisions) == 1 and not degraded:
            return decisions[0]
        if tightest is None:
            return Decision.from_results(results, degraded=degraded, shadow=shadow)
        return Decision(True, tightest.limit, tightest.remaining, tightest.reset_after, None, tightest.policy,
                        results, degraded, shadow)
    worst = max(denied, key=lambda d: d.retry_after if d.retry_after is not None else 0.0) if denied else None
    if worst is None:
        return Decision(False, 0, 0, 0.0, None, "", results, degraded, shadow)
    return worst._replace(allowed=False, results=results, degraded=degraded, shadow=shadow)
