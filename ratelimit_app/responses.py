"""The JSON answers to refused requests: 429 (over a limit), 503 (limiter unavailable), 401 (no usable key).

    429 {"error": "rate limit exceeded", "tier": "free", "policy": "burst", "retry_after": 2.85}
        Retry-After: 3
    429 {"error": "request cost 50 exceeds what policy 'burst' can ever allow (10) ...",
         "tier": "free", "policy": "burst", "retry_after": null}                  (no Retry-After)
    503 {"error": "rate limiter unavailable", "tier": "free", "policy": "", "retry_after": 1.0}
        Retry-After: 1
    401 {"error": "unknown API key"}

`retry_after` in the body is the limiter's wait in seconds (float, millisecond precision);
`Retry-After` is the same rounded up to whole seconds, at least 1. Bodies never echo the key.
"""

from __future__ import annotations

import math

from django.http import JsonResponse

from .decision import Decision
from .headers import retry_after_seconds


def too_many_requests(decision: Decision, tier: str | None, cost: int = 1) -> JsonResponse:
    """429 for a denied decision (with Retry-After unless the request can never be allowed)."""
    retry_after = decision.retry_after
    if retry_after is not None and math.isinf(retry_after):
        body = {
            "error": (f"request cost {cost} exceeds what policy '{decision.policy}' can ever allow "
                      f"({decision.limit}); it will never be allowed"),
            "tier": tier, "policy": decision.policy, "retry_after": None,
        }
        return JsonResponse(body, status=429)
    response = JsonResponse({
        "error": "rate limit exceeded", "tier": tier, "policy": decision.policy,
        "retry_after": round(retry_after, 3) if retry_after is not None else None,
    }, status=429)
    seconds = retry_after_seconds(retry_after)
    response["Retry-After"] = str(seconds if seconds is not None else 1)
    return response


def limiter_unavailable(decision: Decision | None, tier: str | None) -> JsonResponse:
    """503 for a request refused because the limiter cannot decide (fail mode closed or local)."""
    retry_after = decision.retry_after if decision is not None else None
    seconds = retry_after_seconds(retry_after) or 1
    response = JsonResponse({
        "error": "rate limiter unavailable", "tier": tier,
        "policy": decision.policy if decision is not None else "",
        "retry_after": round(retry_after, 3) if retry_after is not None and not math.isinf(retry_after)
        else float(seconds),
    }, status=503)
    response["Retry-After"] = str(seconds)
    return response


def unauthorized(message: str) -> JsonResponse:
    """401 with a message saying what is wrong with the key (never the key itself)."""
    response = JsonResponse({"error": message}, status=401)
    response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


def overloaded(priority: str, retry_after: float) -> JsonResponse:
    """503 for a request the load shedder refused (too many requests in flight for its priority)."""
    seconds = max(1, math.ceil(retry_after))
    response = JsonResponse({
        "error": "service overloaded: request shed", "priority": priority, "retry_after": float(seconds),
    }, status=503)
    response["Retry-After"] = str(seconds)
    return response
