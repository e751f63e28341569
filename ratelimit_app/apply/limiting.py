"""Limit one request: plan it (ratelimit_app.apply.planning), then decide every limit of ours that applies
(the per-IP and tier checks, the load shedder's fleet count, the DRF throttles' and `@ratelimit`'s checks)
in one all-or-nothing Redis call (`decide`), so each is charged at most once and only if all allow. The
shared core of the middleware, the throttles and `@ratelimit`: it returns a `LimitOutcome` and leaves the
HTTP answer to them. `safely` answers with the fail mode, and logs once per cause, whatever goes wrong
inside the limiter. The async twin, ratelimit_app.apply.limiting_async, reads the same plan and reply
(`planned_call`, `conclude`) around the call made on the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from django.http import HttpRequest

from ..conf.settings import IP_POLICY_NAME, InvalidSetting
from ..conf.snapshot import Snapshot, request_settings
from ..core.clientrules import ALLOW
from ..core.decision import Decision
from ..core.engine import new_lease_token
from ..core.logs import logger
from ..core.policies import Policy
from ..service import events
from ..service.guard import without_limits
from ..service.limiter import get_limiter
from . import shedding
from .concurrency import HeldSlots, needs_lease, slots_taken
from .limitcheck import REQUEST_LIMITS, LimitCheck
from .outcome import ALLOWED as ALLOWED
from .outcome import DENIED as DENIED
from .outcome import FORBIDDEN as FORBIDDEN
from .outcome import NOT_LIMITED, summarize
from .outcome import SHED as SHED
from .outcome import UNAUTHORIZED as UNAUTHORIZED
from .outcome import UNAVAILABLE as UNAVAILABLE
from .outcome import LimitOutcome as LimitOutcome
from .planning import FROM_REQUEST, RequestPlan, plan_request
from .planning import limit_config as limit_config


class PlannedCall(NamedTuple):
    """The Redis call one plan needs, before it is made: each check's (identity, policies), the cost
    (0: a report that charges nothing) and the lease under which concurrency slots are taken."""

    plan: RequestPlan
    pairs: list[tuple[str, tuple[Policy, ...]]]
    cost: int
    lease: str | None


def planned_call(plan: RequestPlan, cost: int) -> PlannedCall | LimitOutcome:
    """The call `decide` makes for `plan`, or the outcome when no call is needed (no checks)."""
    if not plan.checks:  # nothing to charge: no per-IP limit and no usable key, or an allow-listed client
        status = UNAUTHORIZED if plan.refusal else ALLOWED
        if plan.listed and cost > 0:
            events.record_decision(allowed=True, tier=plan.label, policy=None, degraded=False,
                                    identity=plan.identity, unauthorized=status == UNAUTHORIZED, listed=ALLOW)
        return LimitOutcome(status, None, (), plan.tier, plan.identity, plan.refusal, cost > 0)
    if plan.refusal:
        cost = max(cost, 1)  # an unusable key is charged to the per-IP limit even on report-only routes
    pairs = []
    taking = False  # a concurrency limit among them: the request's slot is taken in this same call, under a token
    for check in plan.checks:
        pairs.append((check.identity, check.policies))
        taking = taking or (cost > 0 and needs_lease(check.policies))
    return PlannedCall(plan, pairs, cost, new_lease_token() if taking else None)


def decide(plan: RequestPlan, cost: int) -> LimitOutcome:
    """Charge `cost` to every check of `plan` in one all-or-nothing call, and count the request in the
    metrics once. Cost 0 (a report of where the client stands) charges one unit of the per-IP limit
    alone, refused there like any request, and reads the other checks without charging them."""
    call = planned_call(plan, cost)
    if isinstance(call, LimitOutcome):
        return call
    service = get_limiter()
    if call.cost:
        decisions = service.hit_many(call.pairs, call.cost, fail_mode=plan.tier_fail_mode, lease=call.lease)
    else:
        charged = report_charge(call)
        decisions = [service.hit(*charged, 1, fail_mode=plan.tier_fail_mode)] if charged else []
        decisions += [service.peek(identity, policies, fail_mode=plan.fail_mode, fresh=True)
                      for identity, policies in report_peeks(call, decisions)]
    outcome, unwanted = conclude(call, decisions)
    if unwanted is not None:
        unwanted.release()
    return outcome


def report_charge(call: PlannedCall) -> tuple[str, tuple[Policy, ...]] | None:
    """What a report (cost 0) charges one unit: the per-IP limit when the plan starts with it, so a flood
    of status calls is limited (and answered from the deny cache) like any request; else nothing."""
    return call.pairs[0] if reports_ip(call.plan) else None


def report_peeks(call: PlannedCall, decisions: list[Decision]) -> list[tuple[str, tuple[Policy, ...]]]:
    """What a report reads after its charge (`decisions`): the other checks, each with a fresh peek (the
    counts of now, not those a cached denial remembers); none when the per-IP charge was refused."""
    return [] if over_ip_limit(call.plan, decisions) else call.pairs[len(decisions):]


def reports_ip(plan: RequestPlan) -> bool:
    """True when `plan` starts with the per-IP limit, which a report (cost 0) charges one unit."""
    checks = plan.checks
    return bool(checks) and checks[0].owner == REQUEST_LIMITS and checks[0].policies[:1] != () \
        and checks[0].policies[0].name == IP_POLICY_NAME


def over_ip_limit(plan: RequestPlan, decisions: Sequence[Decision]) -> bool:
    """True when a report's charge of the per-IP limit was refused (not for an outage: a report is
    answered, degraded, when the limiter cannot decide)."""
    return bool(decisions) and not decisions[0].allowed and not decisions[0].degraded and reports_ip(plan)


def conclude(call: PlannedCall, decisions: list[Decision]) -> tuple[LimitOutcome, HeldSlots | None]:
    """The outcome of `call` from Redis' `decisions`, counted in the metrics; and the slots to give
    back at once (taken by a request that was refused after all), or None."""
    plan, cost, checks, pairs = call.plan, call.cost, call.plan.checks, call.pairs
    policies, fleet = _shown_policies(checks)
    slots = slots_taken(pairs, decisions, call.lease) if call.lease is not None else None
    summary = summarize(decisions, len(pairs))
    shed_priority: str | None = None
    if fleet is not None:
        fleet_decision = decisions[fleet] if fleet < len(decisions) else None
        kept = [i for i in range(len(checks)) if i != fleet]
        checks, pairs = tuple(checks[i] for i in kept), [pairs[i] for i in kept]
        decisions = [decisions[i] for i in kept if i < len(decisions)]
        shed_priority, summary = _fleet_verdict(call.plan.checks[fleet].owner, fleet_decision,
                                                summarize(decisions, len(kept)), summary, cost)
    if shed_priority is not None:
        status = SHED
    elif summary.allowed or (cost == 0 and not over_ip_limit(plan, decisions)):
        # a report-only request is refused only by its charge of the per-IP limit
        status = UNAUTHORIZED if plan.refusal else ALLOWED
    else:
        status = UNAVAILABLE if summary.degraded else DENIED
    if cost > 0 or status == DENIED:
        _count(plan, summary, status, shed_priority, fleet is not None)
    unwanted = None
    if slots is not None and not summary.allowed:
        unwanted, slots = slots, None  # Redis Cluster charged the identities before the one that refused
    padded = tuple(decisions) + (None,) * (len(pairs) - len(decisions))
    message = plan.refusal if status == UNAUTHORIZED else shed_priority if status == SHED else ""
    outcome = LimitOutcome(status, summary, policies, plan.tier, plan.identity, message or "", cost > 0, checks,
                           padded, slots)
    return outcome, unwanted


def _shown_policies(checks: tuple[LimitCheck, ...]) -> tuple[tuple[Policy, ...], int | None]:
    """The policies the headers show (not the shadow ones, reported apart in Decision.shadow), and the
    index of the load shedder's fleet check (None: none), which is no limit of the client's."""
    shown: list[Policy] = []
    fleet = None
    for index, check in enumerate(checks):  # one pass, no comprehension: this runs on every request
        if not check.owner.startswith(shedding.OWNER_PREFIX):
            for policy in check.policies:
                if not policy.shadow:
                    shown.append(policy)
        elif fleet is None:
            fleet = index
    return tuple(shown), fleet


def _fleet_verdict(owner: str, fleet_decision: Decision | None, own: Decision, summary: Decision,
                   cost: int) -> tuple[str | None, Decision]:
    """The load shedder's fleet count (checked by `owner`) was decided with the rest, but it is no
    limit of the client's: the priority it shed (None: it did not) and the summary the client is
    shown, from its own checks (`own`; the fleet slot, when taken, is among the request's slots)."""
    if cost > 0 and fleet_decision is not None and fleet_decision.results and not fleet_decision.results[0].allowed:
        shed_priority = shedding.priority_of_owner(owner)
        if shed_priority is not None:
            return shed_priority, fleet_decision.refused() if fleet_decision.allowed else fleet_decision
    return None, own.refused() if own.allowed and not summary.allowed else own


def _count(plan: RequestPlan, summary: Decision, status: str, shed_priority: str | None, fleet: bool) -> None:
    """Count one charged request in the metrics (and a shadow limit's would-be refusals, and the load
    shedder's episode)."""
    events.record_decision(
        allowed=summary.allowed, tier=plan.label,
        policy=None if summary.allowed else f"shed.{shed_priority}" if shed_priority else summary.policy,
        degraded=summary.degraded, identity=plan.identity, unauthorized=status == UNAUTHORIZED,
    )
    if summary.allowed and summary.shadow:
        would_block = summary.would_block
        if would_block:  # refusals a shadow limit would have made: counted, never answered
            events.record_shadow_blocked(tier=plan.label, policies=would_block, identity=plan.identity)
    if shed_priority is not None:
        shedding.fleet_episode.record_shed(shed_priority, {"identity": plan.identity})
    elif fleet and status == ALLOWED:
        shedding.fleet_episode.record_admitted()


def limit_request(request: HttpRequest, *, cost: int = 1, scope: str = "", user: Any = FROM_REQUEST,
                  extra: Sequence[LimitCheck] = (), path: str | None = None,
                  settings: Snapshot | None = None) -> LimitOutcome:
    """`plan_request` then `decide`, with `extra` checks decided in the same call (a refusal for an
    unusable key charges the per-IP limit alone). `path`, `settings`: see `plan_request`. Raises what
    `plan_request` raises."""
    planned = plan_request(request, cost=cost, scope=scope, user=user, path=path, settings=settings)
    if isinstance(planned, LimitOutcome):
        return planned
    return decide(planned if planned.refusal else planned.plus(extra), cost)


# -- when the limiter itself fails ------------------------------------------------------------------

#: Causes already logged with their traceback (bounded: a long-lived process logs each cause once).
_logged_causes: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()
_MAX_LOGGED_CAUSES = 1000


def safely(limit: Callable[[], LimitOutcome], *, where: str, identity: str = "") -> LimitOutcome:
    """`limit()`, or, if it raises anything, the answer of the fail mode (logged at ERROR with its traceback
    once per cause, then at DEBUG): the request never fails because of the limiter. With
    RATELIMIT['ENABLED'] = False, `limit` is not called and the request is NOT_LIMITED (no headers)."""
    try:
        if not request_settings().enabled:  # always readable (an invalid one reads as True)
            return NOT_LIMITED
        return limit()
    except Exception as exc:
        return failure_outcome(exc, where, identity)


def failure_outcome(exc: Exception, where: str, identity: str) -> LimitOutcome:
    """The fail mode's outcome when the limiter itself raised `exc` (logged once per cause). The mode is
    RATELIMIT['FAIL_MODE'] as read (an invalid one in its cautious reading): see `without_limits`."""
    mode = request_settings().fail_mode
    _log_once(exc, where, mode)
    decision = without_limits(mode)
    with contextlib.suppress(Exception):
        events.record_decision(allowed=decision.allowed, tier="error", policy=None if decision.allowed else "error",
                               degraded=True, identity=identity or "unknown")
    return LimitOutcome(ALLOWED if decision.allowed else UNAVAILABLE, decision, (), None, identity)


def _log_once(exc: Exception, where: str, mode: str) -> None:
    """ERROR with the traceback for the first request of each cause, DEBUG for the others. An invalid
    setting is only ever DEBUG here: the settings' own log line already said it, once per process."""
    cause = (type(exc).__qualname__, str(exc)[:200])
    with _logged_lock:
        first = cause not in _logged_causes and not isinstance(exc, InvalidSetting)
        if first and len(_logged_causes) < _MAX_LOGGED_CAUSES:
            _logged_causes.add(cause)
    level = logging.ERROR if first else logging.DEBUG
    logger.log(level, "rate limiter failed in %s (%s: %s); the request follows the fail mode %r",
               where, type(exc).__name__, exc, mode, exc_info=exc if first else None,
               extra={"ratelimit_event": "ratelimit.internal_error"})
