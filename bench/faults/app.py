"""The harness's URLconf: the demo's URLs, and the protected view that counts what it serves.

GET /api/faults/hit (limited by the middleware like every /api/ path) adds 1 to the ledger, a hash in the
harness's own Redis, under "<identity>|<window>|<degraded>": the client's identity label ("key:<prefix>"),
the index of the fixed window the limiter charged (from its decision: the window that ends
`reset_after` seconds from now; from this server's clock when the decision was made without the store),
and whether it was. `?ms=N` holds the request (and its concurrency slot) N milliseconds first.
"""

from __future__ import annotations

import os
import time
from functools import cache

import redis
from django.http import HttpRequest, JsonResponse
from django.urls import include, path
from django.views.decorators.http import require_GET

from .tiers import LEDGER_KEY, WINDOW

MAX_HOLD_MS = 20_000


@cache
def ledger() -> redis.Redis:
    return redis.Redis.from_url(os.environ["FAULTS_LEDGER_URL"], socket_timeout=5)


def charged_window(request: HttpRequest, now: float) -> tuple[str, int, bool]:
    """The identity, the window index and whether the decision was degraded, for the ledger."""
    state = getattr(request, "ratelimit", None)
    outcome = state.outcome if state is not None else None
    decision = outcome.decision if outcome is not None else None
    identity = outcome.identity if outcome is not None else "unlimited"
    degraded = decision is None or decision.degraded
    window = next((result for result in decision.results if result.policy == "window"), None) if decision else None
    if window is None or degraded:
        return identity, int(now // WINDOW), True
    return identity, round((now + window.reset_after) / WINDOW) - 1, False


@require_GET
def hit(request: HttpRequest) -> JsonResponse:
    now = time.time()
    identity, window, degraded = charged_window(request, now)
    ledger().hincrby(LEDGER_KEY, f"{identity}|{window}|{int(degraded)}", 1)
    try:
        hold = min(max(int(request.GET.get("ms", "0")), 0), MAX_HOLD_MS)
    except ValueError:
        hold = 0
    if hold:
        time.sleep(hold / 1000)
    return JsonResponse({"window": window, "degraded": degraded, "pid": os.getpid()})


urlpatterns = [
    path("api/faults/hit", hit),
    path("", include("project.urls")),
]
