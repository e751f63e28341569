"""The demo API that shows ratelimit_app at work.

- `GET /health`                 never limited; reports whether Redis answers
- `GET /api/users`              limited by RateLimitMiddleware (per-IP limit + the caller's tier), cost 1
- `POST /api/data`              cost 5 (declared with `limit_cost`)
- `GET /api/rate-limit/status`  the caller's tier and where it stands in each limit; consumes nothing of the
  tier (one unit of the per-IP limit, so a flood of status calls is limited like any other)
- `/drf/items/`                 a DRF viewset limited by `throttle_classes` (outside the middleware's /api/)
- `GET /public/quote`           a plain view limited by the `@ratelimit` decorator, per IP
- `GET /api/slow?ms=500`        a slow request (normal priority): holds the caller's concurrency slot (when
  its tier has a concurrency limit: the seeded tiers have none, staff add one in the admin)
- `GET /api/export?ms=500`      a slow report export: low priority, shed first when the fleet is full
- `GET /api/checkout?ms=500`    a slow critical request: never shed
  (each answers how many requests were in its view, all demo endpoints together, when it entered:
  measured in Redis, so across every worker and server; null when Redis is down)
- `GET /api/stream?chunks=5&ms=100`  a streaming response: holds its slot until the stream is closed
  (it ends within half of the shortest lease it holds, so it never outlives its slot)
- `GET /public/single`          a plain view allowing one request per client IP at once (`@limit_concurrency`)
- `GET /api/async/users`        /api/users as an `async def` view: under ASGI (uvicorn project.asgi:application)
  it is limited and answered on the event loop, with no thread hop
- `GET /public/async-quote`     an `async def` view limited by `@ratelimit`: 5 per minute per client IP
- `/ninja/...`                  a Django Ninja API (project/demo/ninja_api.py)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from rest_framework import viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from ratelimit_app.apply.admission import outcome_of
from ratelimit_app.apply.limiting import limit_request
from ratelimit_app.apply.usage import usage_status
from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.core.exceptions import REDIS_CLIENT_ERRORS
from ratelimit_app.core.policies import CONCURRENCY
from ratelimit_app.decorators import limit_concurrency, limit_cost, ratelimit
from ratelimit_app.service.connection import get_redis
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
    except RecursionError:
        return JsonResponse({"error": "the body is JSON nested too deeply"}, status=400)
    return JsonResponse({"stored": True, "size": len(request.body), "keys": sorted(payload)
                         if isinstance(payload, dict) else []}, status=201)


@limit_cost(0)
@require_GET
def rate_limit_status(request: HttpRequest) -> JsonResponse:
    """The caller's tier and, for each limit, what remains and when it resets. Consumes nothing of the
    tier; the middleware charges it one unit of the per-IP limit (429 over it, from the deny cache)."""
    outcome = outcome_of(request)
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
    limits += usage_status(outcome)  # the tier's usage limits (tokens), each scope's, with what remains
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


async def users_async(request: HttpRequest) -> JsonResponse:
    """/api/users as an `async def` view (cost 1): limited by RateLimitMiddleware like any other."""
    if request.method != "GET":
        return JsonResponse({"error": "method not allowed"}, status=405)
    return JsonResponse({"users": USERS})


@ratelimit(rate="5/m", key="ip", group="async-quote")
async def quote_async(request: HttpRequest) -> JsonResponse:
    """An `async def` view limited by the decorator, decided on the event loop: 5 per minute per IP."""
    return JsonResponse({"quote": QUOTES[0]})


#: The most a demo endpoint sleeps (ms=...), so a client cannot hold a worker for long.
MAX_SLEEP_MS = 10_000


def _sleep_ms(request: HttpRequest, default: int = 500) -> int:
    try:
        ms = int(request.GET.get("ms", default))
    except ValueError:
        ms = default
    return min(max(ms, 0), MAX_SLEEP_MS)


def _in_flight_key(kind: str) -> str:
    return f"{ratelimit_settings.KEY_PREFIX}:demo:in-flight:{kind}"


def _slow(request: HttpRequest, kind: str) -> JsonResponse:
    """Sleep ms milliseconds, counting the requests inside demo views (all, and of this kind) in Redis:
    each response says how many were inside when it entered (itself included; null when Redis could
    not count: the view answers anyway, as the limiter does when Redis is down)."""
    ms = _sleep_ms(request)
    counted = _count_in(kind, +1)
    try:
        time.sleep(ms / 1000)
    finally:
        if counted is not None:
            _count_in(kind, -1)
    in_flight, of_kind = counted if counted is not None else (None, None)
    return JsonResponse({"slept_ms": ms, "kind": kind, "in_flight": in_flight, "in_flight_of_kind": of_kind})


#: What asking Redis raises when it cannot answer (or RATELIMIT names no usable Redis).
_REDIS_DOWN: tuple[type[Exception], ...] = (ImproperlyConfigured, *REDIS_CLIENT_ERRORS)


def _count_in(kind: str, step: int) -> tuple[int, int] | None:
    """Add `step` to the counts of requests inside demo views (all, and of `kind`); the new counts, or
    None when Redis cannot be asked."""
    try:
        pipe = get_redis().pipeline(transaction=False)
        pipe.incrby(_in_flight_key("all"), step)
        pipe.incrby(_in_flight_key(kind), step)
        pipe.expire(_in_flight_key("all"), 600)
        pipe.expire(_in_flight_key(kind), 600)
        in_flight, of_kind, _, _ = pipe.execute()
    except _REDIS_DOWN:
        return None
    return int(in_flight), int(of_kind)


@require_GET
def slow(request: HttpRequest) -> JsonResponse:
    """A slow request of normal priority (cost 1): it holds the caller's concurrency slot (if its tier has a
    concurrency limit) while it runs."""
    return _slow(request, "slow")


@limit_cost(priority="low")
@require_GET
def export(request: HttpRequest) -> JsonResponse:
    """A slow report export: low priority, the first to be shed when the fleet is overloaded."""
    return _slow(request, "export")


@limit_cost(priority="critical")
@require_GET
def checkout(request: HttpRequest) -> JsonResponse:
    """A slow critical request: counted in flight, never shed."""
    return _slow(request, "checkout")


#: The longest share of the shortest lease a stream holds (its concurrency slot, its fleet place) that
#: it may run: it ends while they are still held (docs/protection.md: a lease above the slowest request).
STREAM_LEASE_SHARE = 0.5


@require_GET
def stream(request: HttpRequest) -> StreamingHttpResponse:
    """`chunks` lines, `ms` milliseconds apart: the caller's slot (if its tier has a concurrency limit) is held
    until the stream is closed. At most as many chunks as fit in half of the shortest lease the request
    holds, else MAX_SLEEP_MS."""
    ms = _sleep_ms(request, 100)
    try:
        chunks = min(max(int(request.GET.get("chunks", 5)), 1), 1000)
    except ValueError:
        chunks = 5
    if ms:
        chunks = min(chunks, 1 + _stream_limit_ms(request) // ms)

    def lines() -> Iterator[bytes]:
        for number in range(chunks):
            if number:
                time.sleep(ms / 1000)
            yield b"chunk %d\n" % number

    async def async_lines() -> AsyncIterator[bytes]:
        for number in range(chunks):
            if number:
                await asyncio.sleep(ms / 1000)
            yield b"chunk %d\n" % number

    # Django buffers a whole iterator of the other kind before sending it: under ASGI, stream an async one
    if isinstance(request, ASGIRequest):
        return StreamingHttpResponse(async_lines(), content_type="text/plain")
    return StreamingHttpResponse(lines(), content_type="text/plain")


def _stream_limit_ms(request: HttpRequest) -> int:
    """How long a stream of `request` may run: STREAM_LEASE_SHARE of the shortest lease it holds, else
    MAX_SLEEP_MS."""
    outcome = outcome_of(request)
    leases = [policy.period for check in (outcome.checks if outcome is not None else ())
              for policy in check.policies if policy.algorithm == CONCURRENCY]
    return int(min(leases) * 1000 * STREAM_LEASE_SHARE) if leases else MAX_SLEEP_MS


@require_GET
@limit_concurrency(1, key="ip", lease=30)
def single(request: HttpRequest) -> JsonResponse:
    """A plain view outside the middleware's paths: one request per client IP at once."""
    time.sleep(_sleep_ms(request, 0) / 1000)
    return JsonResponse({"single": True})
