"""Usage limits in request handling: a view declares how to estimate its usage (`@usage(tokens=...)`), the
request reserves the estimate in its one decision, and what it reports using is settled when it ends.

    @usage(tokens=lambda request: prompt_tokens(request) + max_tokens(request))
    def chat(request): ...
        request.ratelimit.report_usage("tokens", n)   # as it goes (a stream: chunk by chunk)

The estimate is reserved only against the usage limits of its unit that apply to the route (a tier limit
with that unit, in the route's scope or unscoped); a route with none makes a plain decision, as any other
route. The settlement (`UsageMeter.settle`, one call) runs once the response ends, however it ends: the
view returned, a stream finished or was cut off, the view raised. Units the view never reported stay
charged at their estimate. The async twin is ratelimit_app.apply.usage_async.
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
from ..core.usage import NO_RESERVATION, Reservation, usage_pairs
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
    if found is None:
        found = getattr(getattr(view, "view_class", None), ATTRIBUTE, None)
    return found


def estimate(request: HttpRequest, estimators: Mapping[str, Estimator]) -> Usage | JsonResponse:
    """The request's estimates, or a 400 JSON answer when one cannot be made from it (the view's
    estimator raised ValueError, its message shown, or another error; or gave no whole number >= 1)."""
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


def with_usage(plan: RequestPlan, scope: str, usage: Usage) -> tuple[RequestPlan, Usage]:
    """`plan` with the usage limits the estimates of `usage` reserve (those of the tier's check), and the
    estimates that have such a limit: () when none applies (the decision is then a plain one)."""
    tier = plan.tier
    limits = tier.usage_for(scope) if tier is not None and usage else ()
    units = {unit for unit, _ in usage}
    limits = tuple(policy for policy in limits if policy.unit in units)
    if not limits:
        return plan, ()
    checks = tuple(LimitCheck(check.identity, (*check.policies, *limits), check.owner, check.label)
                   if check.owner == REQUEST_LIMITS and check.identity == plan.identity else check
                   for check in plan.checks)
    held = {policy.unit for policy in limits}
    return plan._replace(checks=checks), tuple((unit, count) for unit, count in usage if unit in held)


def decide(plan: RequestPlan, cost: int, usage: Usage) -> tuple[LimitOutcome, Reservation]:
    """`limiting.decide` with the estimates of `usage` reserved in the same call; what to settle later."""
    call = limiting.planned_call(plan, cost)
    if isinstance(call, LimitOutcome):
        return call, NO_RESERVATION
    decisions, reserved = get_limiter().reserve_many(call.pairs, max(call.cost, 1), usage,
                                                     fail_mode=plan.tier_fail_mode, lease=call.lease)
    outcome, unwanted = limiting.conclude(call._replace(cost=max(call.cost, 1)), decisions)
    if unwanted is not None:
        unwanted.release()
    return outcome, reserved


def limit_request(request: HttpRequest, *, cost: int, scope: str, usage: Usage, extra: Any = (),
                  path: str | None = None, settings: Snapshot | None = None,
                  user: Any = FROM_REQUEST) -> tuple[LimitOutcome, UsageMeter | None]:
    """`limiting.limit_request` for a request that reserves `usage`: the outcome, and the meter to settle
    when the request ends (None when it reserved nothing). `user`: see `plan_request` (a framework's
    authenticated user, for the throttles)."""
    planned = plan_request(request, cost=cost, scope=scope, user=user, path=path, settings=settings)
    if isinstance(planned, LimitOutcome):
        return planned, None
    if not planned.refusal:
        planned = planned.plus(extra() if callable(extra) else extra)
    planned, usage = with_usage(planned, scope, usage)
    if not usage or planned.refusal:
        return limiting.decide(planned, cost), None
    outcome, reserved = decide(planned, cost, usage)
    return outcome, UsageMeter(reserved, planned.label) if reserved.held else None


class UsageMeter:
    """What one request reserved (under the usage limits of tier `tier`, its metrics label), what it reports
    using, and its settlement (once)."""

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
        """What to settle, once (None: already settled, or nothing reported); counted in the metrics then."""
        with self._lock:
            if self.settled:
                return None
            self.settled = True
            used = dict(self.used)
        self.count(used)
        return used or None

    def count(self, used: Mapping[str, int]) -> None:
        """Report to the metrics the units used under each usage limit held: what was reported, or the
        estimate (which stays charged) for a unit the request never reported."""
        charged = {unit: used.get(unit, self.reservation.estimate(unit)) for unit in self.reservation.units}
        limits = {policy.name: policy.unit for _, policies in self.reservation.held for policy in policies
                  if policy.unit in charged}
        events.record_usage(tier=self.tier, used=tuple((name, unit, charged[unit])
                                                       for name, unit in sorted(limits.items())))

    def settle(self) -> None:
        """Settle the reservation at what was reported (never raises: a failure leaves the estimate charged,
        logged once)."""
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
    """What a response of a request that reserved usage gets: the usage headers, and for a stream, its
    settlement as soon as its last chunk is made (before the server ends the response, so a client's next
    request finds it settled). A stream cut off, and any other response, is settled when it is closed."""
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
    """The headers LLM API clients read (RATELIMIT['USAGE_HEADERS']), for each usage limit the request
    reserved against: x-ratelimit-limit-<unit>, x-ratelimit-remaining-<unit>, x-ratelimit-reset-<unit>
    (of the limit nearest to refusing, when several of one unit apply)."""
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
    """Every usage limit of the client's tier (each scope's), with what remains now: one peek per scope
    that has any (the status endpoint's and `ratelimit_status`'s rows)."""
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
