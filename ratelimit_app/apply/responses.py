"""The JSON answers to refused requests: 429 (over a limit), 503 (limiter unavailable or load shed), 401
(no usable key), 403 (a deny rule), 400 (a gateway's description that cannot be read). RATELIMIT['ERROR_FORMAT']
chooses plain JSON or RFC 9457 problem details (both shown in docs/plans.md). `retry_after`
in a body is the limiter's wait in seconds; `Retry-After` the same rounded up, at least 1. Bodies never
echo the key.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from django.http import HttpResponseBase, JsonResponse

from ..conf.snapshot import Snapshot, request_settings
from ..core.decision import Decision
from . import shedding
from .headers import apply_headers, retry_after_seconds
from .outcome import DENIED, FORBIDDEN, SHED, UNAUTHORIZED, LimitOutcome

PROBLEM_CONTENT_TYPE = "application/problem+json"
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
TEMPORARY_REDUCED_CAPACITY = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
_TITLES = {
    QUOTA_EXCEEDED: "Request cannot be satisfied as assigned quota has been exceeded",
    TEMPORARY_REDUCED_CAPACITY: "Request cannot be satisfied due to temporary server capacity constraints",
}
_STATUS_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden"}


def _problem_format() -> bool:
    return request_settings().error_format == "problem"  # always readable (an invalid one: "json")


def _answer(status: int, body: dict[str, Any], *, problem_type: str = "about:blank",
            violated: Sequence[str] = ()) -> JsonResponse:
    """`body` as JSON, or as RFC 9457 problem details when RATELIMIT['ERROR_FORMAT'] is "problem"
    (its "error" becomes "detail"; the other members stay as extension members)."""
    if not _problem_format():
        return JsonResponse(body, status=status)
    problem: dict[str, Any] = {
        "type": problem_type,
        "title": _TITLES.get(problem_type) or _STATUS_TITLES.get(status, "Error"),
        "status": status,
        "detail": body.get("error", ""),
    }
    if problem_type == QUOTA_EXCEEDED:
        problem["violated-policies"] = list(violated)
    problem.update((name, value) for name, value in body.items() if name != "error")
    return JsonResponse(problem, status=status, content_type=PROBLEM_CONTENT_TYPE)


def _violated_policies(decision: Decision) -> list[str]:
    """The names of the policies that refused (the `violated-policies` member)."""
    names = [result.policy for result in decision.results if not result.allowed]
    return names or ([decision.policy] if decision.policy else [])


def too_many_requests(decision: Decision, tier: str | None, cost: int = 1, unit: str = "") -> JsonResponse:
    """429 for a denied decision (with Retry-After unless the request can never be allowed); `unit`, that of
    the refusing policy when it is a usage limit (its body then names it: "unit")."""
    retry_after = decision.retry_after
    units = {"unit": unit} if unit else {}
    if retry_after is not None and math.isinf(retry_after):
        asked = f"the {unit} this request reserves exceed" if unit else f"request cost {cost} exceeds"
        body = {
            "error": (f"{asked} what policy '{decision.policy}' can ever allow "
                      f"({decision.limit}); it will never be allowed"),
            "tier": tier, "policy": decision.policy, **units, "retry_after": None,
        }
        return _answer(429, body, problem_type=QUOTA_EXCEEDED, violated=_violated_policies(decision))
    response = _answer(429, {
        "error": f"{unit} limit exceeded" if unit else "rate limit exceeded", "tier": tier, "policy": decision.policy,
        **units, "retry_after": round(retry_after, 3) if retry_after is not None else None,
    }, problem_type=QUOTA_EXCEEDED, violated=_violated_policies(decision))
    response["Retry-After"] = str(retry_after_seconds(retry_after))
    return response


def limiter_unavailable(decision: Decision | None, tier: str | None) -> JsonResponse:
    """503 for a request refused because the limiter cannot decide (fail mode closed or local)."""
    retry_after = decision.retry_after if decision is not None else None
    seconds = retry_after_seconds(retry_after)
    response = _answer(503, {
        "error": "rate limiter unavailable", "tier": tier,
        "policy": decision.policy if decision is not None else "",
        "retry_after": round(retry_after, 3) if retry_after is not None and not math.isinf(retry_after)
        else float(seconds),
    }, problem_type=TEMPORARY_REDUCED_CAPACITY)
    response["Retry-After"] = str(seconds)
    return response


def unauthorized(message: str) -> JsonResponse:
    """401 with a message saying what is wrong with the key (never the key itself)."""
    response = _answer(401, {"error": message})
    response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def forbidden(message: str) -> JsonResponse:
    """403 for a client refused by a deny rule (ClientRule)."""
    return _answer(403, {"error": message})


def bad_request(message: str) -> JsonResponse:
    """400 for a request the limiter cannot read (a gateway's description of the request it asks about)."""
    return _answer(400, {"error": message})


def overloaded(priority: str, retry_after: float) -> JsonResponse:
    """503 for a request the load shedder refused (too many requests in flight for its priority)."""
    seconds = retry_after_seconds(retry_after)
    response = _answer(503, {
        "error": "service overloaded: request shed", "priority": priority, "retry_after": float(seconds),
    }, problem_type=TEMPORARY_REDUCED_CAPACITY)
    response["Retry-After"] = str(seconds)
    return response


def add_headers(response: HttpResponseBase, outcome: LimitOutcome, settings: Snapshot | None = None) -> None:
    """Add the rate limit headers RATELIMIT['HEADERS'] chooses (as `settings`, default: of now, read it;
    none when it has no reading) for this outcome (none for a request the load shedder refused: it was
    refused for the fleet's load, not for the client's limits)."""
    if outcome.decision is not None and outcome.policies and outcome.status != SHED:
        settings = settings or request_settings()
        if settings.headers is not None:
            try:
                apply_headers(response, outcome.decision, outcome.policies, outcome.tier_slug, settings.headers,
                              settings.header_draft)
            except Exception:  # noqa: S110 (headers are informative; never fail a response for them)
                pass


def refusal(outcome: LimitOutcome, cost: int = 1) -> HttpResponseBase:
    """The 429, 503, 401 or 403 answer to a refused outcome, with the rate limit headers."""
    decision = outcome.decision
    if outcome.status == FORBIDDEN:
        return forbidden(outcome.message)
    if outcome.status == UNAUTHORIZED:
        response = unauthorized(outcome.message)
    elif outcome.status == SHED:
        return overloaded(outcome.message, shedding.shed_config().retry_after)  # no rate-limit headers
    elif outcome.status == DENIED and decision is not None:
        unit = next((p.unit for p in outcome.policies if p.name == decision.policy), "")
        response = too_many_requests(decision, outcome.tier_slug, cost, unit)
    else:
        response = limiter_unavailable(decision, outcome.tier_slug)
    add_headers(response, outcome)
    return response
