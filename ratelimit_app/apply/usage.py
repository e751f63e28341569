"""Usage limits in request handling: a view declares how to estimate its usage (`@usage(tokens=...)`), the
request reserves the estimate in its one decision, and what it reports using is settled once the response
ends, however it ends (docs/usage.md). The async twin is ratelimit_app.apply.usage_async.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

from django.http import HttpRequest, HttpResponseBase, JsonResponse, StreamingHttpResponse

from ..conf.snapshot import Snapshot
from ..core.engine import Usage
from ..core.logs import log_once
from ..core.usage import Reservation, usage_pairs
from ..service import events
from ..service.limiter import get_limiter
from ..service.limiter_async import get_async_limiter
from . import limiting
from .limitcheck import REQUEST_LIMITS, LimitCheck
from .outcome import LimitOutcome
from .planning import FROM_REQUEST, RequestPlan, plan_request

#: Attribute of a view that declares its usage: {unit: estimator(request) -> int}.
ATTRIBUTE = "ratelimit_usage"
Estimator = Callable[[HttpRequest], int]
ViewT = TypeVar("ViewT", bound=Callable[..., Any])


def declare(view: ViewT, estimators: Mapping[str, Estimator]) -> ViewT:
    """Mark `view` (a function or a class) as reserving usage: each unit's estimate is `estimators[unit](request)`."""
    if not estimators:
        raise ValueError("usage: name at least one unit and how to estimate it, such as tokens=lambda request: 500")
    for unit, estimator in estimators.items():
        usage_pairs({unit: 1})  # the unit's name is checked here, at import time
        if not callable(estimator):
            raise TypeError(f"usage: the estimate of {unit} must be a function of the request, got {estimator!r:.60}")
    setattr(view, ATTRIBUTE, dict(estimators))
    view_class = getattr(view, "cls", None)  # a DRF @api_view function: its view's throttles read the class
    if isinstance(view_class, type):
        setattr(view_class, ATTRIBUTE, dict(estimators))
    return view


def estimators_of(view: Any) -> dict[str, Estimator] | None:
    """What `view` (or its class-based view's class) declared with `declare`, or None."""
    found = getattr(view, ATTRIBUTE, None)
    return getattr(getattr(view, "view_class", None), ATTRIBUTE, None) if found is None else found


def estimate(request: HttpRequest, estimators: Mapping[str, Estimator]) -> Usage | JsonResponse:
    """The request's estimates, or a 400 JSON answer when one cannot be made from it (an estimator raised,
    or gave no whole number >= 1)."""
    counts: dict[str, int] = {}
    for unit, estimator in estimators.items():
        try:
            counts[unit] = estimator(request)
        except ValueError as exc:
            return _bad_estimate(unit, str(exc) or "not a valid request")
        except Exception:  # the request's data did not hold what the estimator looked for
            return _bad_estimate(unit, "could not be estimated from the request")
    try:
        return usage_pairs(counts)
    except (ValueError, TypeError) as exc:
        return _bad_estimate(", ".join(counts), str(exc))


def _bad_estimate(unit: str, problem: str) -> JsonResponse:
    return JsonResponse({"detail": f"The request's {unit} {problem}."[:300], "unit": unit}, status=400)


def reserving(plan: RequestPlan, scope: str, usage: Usage, extra: Any) -> tuple[RequestPlan, Usage]:
    """`plan` with its `extra` checks (or what a callable `extra` gives) and the usage limits the estimates
    of `usage` reserve (the tier's, in `scope` or unscoped), and the estimates that have such a limit: ()
    when none applies, or the plan refuses (the decision is then a plain one)."""
    if plan.refusal:
        return plan, ()
    plan = plan.plus(extra() if callable(extra) else extra)
    tier, units = plan.tier, {unit for unit, _ in usage}
    limits = tuple(policy for policy in tier.usage_for(scope) if policy.unit in units) if tier is not None else ()
    if not limits:
        return plan, ()
    checks = tuple(LimitCheck(check.identity, (*check.policies, *limits), check.owner, check.label)
                   if check.owner == REQUEST_LIMITS and check.identity == plan.identity else check
                   for check in plan.checks)
    held = {policy.unit for policy in limits}
    return plan._replace(checks=checks), tuple((unit, count) for unit, count in usage if unit in held)


def reserving_call(plan: RequestPlan, cost: int) -> limiting.PlannedCall | LimitOutcome:
    """`limiting.planned_call` for a decision that reserves usage: it always charges (a cost of at least 1)."""
    call = limiting.planned_call(plan, cost)
    return call if isinstance(call, LimitOutcome) else call._replace(cost=max(call.cost, 1))


def metered(plan: RequestPlan, reserved: Reservation) -> UsageMeter | None:
    """The meter of what a decision over `plan` reserved (None: nothing)."""
    return UsageMeter(reserved, plan.label) if reserved.held else None


def limit_request(request: HttpRequest, *, cost: int, scope: str, usage: Usage, extra: Any = (),
                  path: str | None = None, settings: Snapshot | None = None,
                  user: Any = FROM_REQUEST) -> tuple[LimitOutcome, UsageMeter | None]:
    """`limiting.limit_request` for a request that reserves `usage`, in the same call as its other limits:
    the outcome, and the meter to settle when the request ends (None when it reserved nothing)."""
    planned = plan_request(request, cost=cost, scope=scope, user=user, path=path, settings=settings)
    if isinstance(planned, LimitOutcome):
        return planned, None
    plan, usage = reserving(planned, scope, usage, extra)
    if not usage:
        return limiting.decide(plan, cost), None
    call = reserving_call(plan, cost)
    if isinstance(call, LimitOutcome):
        return call, None
    decisions, reserved = get_limiter().reserve_many(call.pairs, call.cost, usage, fail_mode=plan.tier_fail_mode,
                                                     lease=call.lease)
    outcome, unwanted = limiting.conclude(call, decisions)
    if unwanted is not None:
        unwanted.release()
    return outcome, metered(plan, reserved)


class UsageMeter:
    """What one request reserved (`tier`: its metrics label), what it reports using, and its settlement (once)."""

    __slots__ = ("_lock", "reservation", "settled", "tier", "used")

    def __init__(self, reservation: Reservation, tier: str = "") -> None:
        self.reservation = reservation
        self.tier = tier
        self.used: dict[str, int] = {}
        self.settled = False
        self._lock = threading.Lock()

    def report(self, unit: str, count: int) -> None:
        """Add `count` units of `unit` to what the request used (a unit it reserved nothing of is ignored)."""
        if type(count) is not int or count < 0:
            raise ValueError(f"report_usage: {unit}={count!r:.40} must be a whole number >= 0")
        if unit in self.reservation.units:
            with self._lock:
                self.used[unit] = self.used.get(unit, 0) + count

    def take(self) -> dict[str, int] | None:
        """What to settle, once (None: already settled, or nothing reported); counted in the metrics."""
        with self._lock:
            if self.settled:
                return None
            self.settled = True
            used = dict(self.used)
        self.count(used)
        return used or None

    def count(self, used: Mapping[str, int]) -> None:
        """Report to the metrics the units used under each limit held (a unit never reported: its estimate)."""
        charged = {unit: used.get(unit, self.reservation.estimate(unit)) for unit in self.reservation.units}
        limits = {policy.name: policy.unit for _, policies in self.reservation.held for policy in policies
                  if policy.unit in charged}
        events.record_usage(tier=self.tier, used=tuple((name, unit, charged[unit])
                                                       for name, unit in sorted(limits.items())))

    def settle(self) -> None:
        """Settle the reservation at what was reported (never raises: a failure is logged once)."""
        used = self.take()
        if used is None:
            return
        try:
            if not get_limiter().settle(self.reservation, used):
                _settle_failed("Redis could not be asked")
        except Exception as exc:
            _settle_failed(f"{type(exc).__name__}: {exc}")

    async def asettle(self) -> None:
        """`settle` through the async service, on the event loop."""
        used = self.take()
        if used is None:
            return
        try:
            if not await get_async_limiter().settle(self.reservation, used):
                _settle_failed("Redis could not be asked")
        except Exception as exc:
            _settle_failed(f"{type(exc).__name__}: {exc}")


def _settle_failed(reason: str) -> None:
    log_once("ratelimit.settle_failed", logging.WARNING, reason=reason[:200])


def finish(response: HttpResponseBase, outcome: LimitOutcome | None, meter: UsageMeter,
           settings: Snapshot | None) -> None:
    """The usage headers, and for a stream, its settlement as soon as its last chunk is made (so that the
    client's next request finds it settled); any other response is settled when it is closed."""
    if settings is not None and settings.values.get("USAGE_HEADERS") is True:
        add_usage_headers(response, outcome)
    if isinstance(response, StreamingHttpResponse):
        chunks = response.streaming_content
        if isinstance(chunks, AsyncIterator):
            response.streaming_content = _settled_async(chunks, meter)
        else:
            response.streaming_content = _settled(chunks, meter)


def _settled(chunks: Iterator[bytes], meter: UsageMeter) -> Iterator[bytes]:
    yield from chunks
    meter.settle()


async def _settled_async(chunks: AsyncIterator[bytes], meter: UsageMeter) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk
    await meter.asettle()


def _duration(seconds: float) -> str:
    """A wait as LLM APIs spell it in x-ratelimit-reset-*: "1m30s", "12s", "0.5s"."""
    if seconds < 60:
        return f"{max(seconds, 0):.3g}s"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    return (f"{hours}h" if hours else "") + f"{rest // 60}m{rest % 60}s"


def add_usage_headers(response: HttpResponseBase, outcome: LimitOutcome | None) -> None:
    """The x-ratelimit-{limit,remaining,reset}-<unit> headers LLM API clients read (RATELIMIT['USAGE_HEADERS']),
    of the limit of each unit nearest to refusing."""
    if outcome is None or outcome.decision is None:
        return
    units = {policy.name: policy.unit for policy in outcome.policies if policy.unit}
    shown: set[str] = set()
    for result in sorted((r for r in outcome.decision.results if r.policy in units), key=lambda r: r.remaining):
        unit = units[result.policy]
        if unit not in shown:
            shown.add(unit)
            response[f"x-ratelimit-limit-{unit}"] = str(result.limit)
            response[f"x-ratelimit-remaining-{unit}"] = str(result.remaining)
            response[f"x-ratelimit-reset-{unit}"] = _duration(result.reset_after)


def usage_status(outcome: LimitOutcome) -> list[dict[str, Any]]:
    """Every usage limit of the client's tier, with what remains now: one peek per scope (the status rows)."""
    tier = outcome.tier
    if tier is None or not tier.usage or not outcome.identity:
        return []
    rows = []
    for scope, policies in sorted(tier.usage.items()):
        decision = get_limiter().peek(outcome.identity, policies, fresh=True)
        results = {result.policy: result for result in decision.results}
        for policy in policies:
            result = results.get(policy.name)
            rows.append({"name": policy.name, "unit": policy.unit, "scope": scope or None,
                         "algorithm": policy.algorithm, "limit": policy.limit, "period": policy.period,
                         "remaining": result.remaining if result and not decision.degraded else None,
                         "reset": round(result.reset_after, 3) if result and not decision.degraded else None})
    return rows
