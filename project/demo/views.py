"""The demo API that shows ratelimit_app at work.

- `GET /health`                 never limited; reports whether Redis answers
- `GET /api/users`              limited by RateLimitMiddleware (per-IP limit + the caller's tier), cost 1
- `POST /api/data`              cost 5 (declared with `limit_cost`)
- `GET /api/rate-limit/status`  the caller's tier and where it stands in each limit; consumes nothing
- `/drf/items/`                 a DRF viewset limited by `throttle_classes` (outside the middleware's /api/)
- `GET /public/quote`           a plain view limited by the `@ratelimit` decorator, per IP
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from rest_framework import viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from ratelimit_app.connection import get_redis
from ratelimit_app.decorators import ratelimit
from ratelimit_app.exceptions import REDIS_CLIENT_ERRORS
from ratelimit_app.limiting import LimitOutcome, limit_request
from ratelimit_app.middleware import REQUEST_ATTRIBUTE
from ratelimit_app.routes import limit_cost
from ratelimit_app.throttling import ScopedRateThrottle, TierRateThrottle

USERS = [
    {"id": 1, "username": "ada", "name": "Ada Lovelace"},
    {"id": 2, "username": "grace", "name": "Grace Hopper"},
    {"id": 3, "username": "alan", "name": "Alan Turing"},
]
ITEMS = [{"id": 1, "name": "widget"}, {"id": 2, "name": "gadget"}, {"id": 3, "name": "gizmo"}]
QUOTES = ["Premature optimization is the root of all evil.", "Simple is better than complex."]


def health(request: HttpRequest) -> JsonResponse:
    """Never limited; reports whether Redis answers ("misconfigured": RATELIMIT is invalid, see check)."""
    try:
        redis = "up" if get_redis().ping() else "down"
    except ImproperlyConfigured:
        redis = "misconfigured"
    except REDIS_CLIENT_ERRORS:
        redis = "down"
    return JsonResponse({"status": "ok", "redis": redis})


@require_GET
def users(request: HttpRequest) -> JsonResponse:
    """A cheap read endpoint: cost 1."""
    return JsonResponse({"users": USERS})


@csrf_exempt  # an API authenticated by key, not by a session cookie
@limit_cost(5, methods=["POST"])
@require_POST
def data(request: HttpRequest) -> JsonResponse:
    """A write endpoint that costs 5 units of every limit."""
    try:
        payload = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return JsonResponse({"error": "the body must be JSON"}, status=400)
    return JsonResponse({"stored": True, "size": len(request.body), "keys": sorted(payload)
                         if isinstance(payload, dict) else []}, status=201)


@limit_cost(0)
@require_GET
def rate_limit_status(request: HttpRequest) -> JsonResponse:
    """The caller's tier and, for each limit, what remains and when it resets. Consumes nothing."""
    outcome: LimitOutcome | None = request.__dict__.get(REQUEST_ATTRIBUTE)
    if outcome is None or outcome.charged:  # the middleware is off for this path: decide here
        outcome = limit_request(request, cost=0)
    if not outcome.allowed:  # 401 (and 429 for an IP over its limit) are the middleware's answers
        return JsonResponse({"error": outcome.message or outcome.status}, status=401)
    decision = outcome.decision
    results = {r.policy: r for r in (*decision.results, *decision.shadow)} if decision is not None else {}
    # the effective set: the tier's limits with the key's or user's overrides, shadow ones included
    policies = [*outcome.policies, *(p for check in outcome.checks for p in check.policies if p.shadow)]
    limits = []
    for policy in policies:
        result = results.get(policy.name)
        limits.append({
            "name": policy.name, "algorithm": policy.algorithm, "limit": policy.limit,
            "period": policy.period, "burst": policy.burst, "shadow": policy.shadow,
            "calendar": policy.calendar or None,  # "day", "week", "month": a calendar quota
            "used": policy.capacity - result.remaining if result else None,
            "remaining": result.remaining if result else None,
            "reset": round(result.reset_after, 3) if result else None,
        })
    return JsonResponse({
        "tier": outcome.tier_slug, "identity": outcome.identity,
        "degraded": bool(decision and decision.degraded), "limits": limits,
    })


class ItemViewSet(viewsets.ViewSet):
    """A DRF viewset limited by its throttle classes: the caller's tier, plus 30/min per caller."""

    throttle_classes = [TierRateThrottle, ScopedRateThrottle]
    throttle_scope = "items"

    def list(self, request: Request) -> Response:
        return Response({"items": ITEMS})

    def retrieve(self, request: Request, pk: Any = None) -> Response:
        for item in ITEMS:
            if str(item["id"]) == str(pk):
                return Response(item)
        raise NotFound(f"no item {pk}")


@require_GET
@ratelimit(rate="5/m", key="ip")
def quote(request: HttpRequest) -> JsonResponse:
    """A plain view limited by the decorator: 5 per minute per client IP."""
    return JsonResponse({"quote": QUOTES[len(request.path) % len(QUOTES)]})
