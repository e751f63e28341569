"""The HTTP variants: what stands between the server and the trivial view in each run.

`configure(settings, variant)` adjusts the bench settings module for one variant; `VARIANTS` (served
by gunicorn, a plain view) and `ASGI_VARIANTS` (served by uvicorn, an `async def` view) describe them
for the report. Every variant serves GET /api/ping with the same small JSON body, and every limiter
is configured with a limit high enough that nothing is denied during the run.
"""

from __future__ import annotations

from typing import Any

from ratelimit_app.conf.settings import DEFAULTS

#: The limit each peer gets in the HTTP runs: far above what a run can send, so nothing is denied.
HUGE_RATE = "1000000/m"

#: The per-IP algorithm the middleware variant runs with: the default, not set by the bench settings.
IP_ALGORITHM = DEFAULTS["IP_ALGORITHM"]

#: What our middleware variants configure (the gunicorn one and both ASGI ones).
_OURS = ("RateLimitMiddleware with the default settings: per-IP limit (IP_RATE, {ip}) + the API key's seeded "
         "tier (enterprise as migrate makes it: token_bucket, sliding_window, fixed_window) decided in one EVALSHA, "
         "rate-limit headers on the response, metrics on")

#: variant -> (label, what is configured), in report order.
VARIANTS: dict[str, tuple[str, str]] = {
    "none": ("no limiter", "plain Django view returning JsonResponse; no middleware"),
    "evalsha": ("one bare EVALSHA (the floor)",
                "the same view, plus client.evalsha() of the INCR script on ratelimit_app's Redis client "
                "(connection.get_redis(): same timeouts, no retries) with the client IP as key"),
    "ours": ("ratelimit_app middleware", _OURS.format(ip=IP_ALGORITHM)),
    "drf-none": ("DRF APIView, no throttle", "DRF APIView returning Response; no throttle (DRF's own cost)"),
    "drf": ("DRF AnonRateThrottle", f"the DRF APIView with AnonRateThrottle at {HUGE_RATE} on the django-redis cache"),
    "django-ratelimit": ("django-ratelimit",
                         f"the plain view under @ratelimit(key='ip', rate='{HUGE_RATE}', block=True), "
                         "django-redis cache"),
    "smart": ("django-smart-ratelimit",
              f"the plain view under @rate_limit(key='ip', rate='{HUGE_RATE}'), Redis backend, "
              "default algorithm (sliding_window)"),
}

#: ASGI variant -> (label, what is configured), in report order. Each serves the same `async def` view.
ASGI_VARIANTS: dict[str, tuple[str, str]] = {
    "async-none": ("async view, no limiter", "`async def` view returning JsonResponse; no middleware"),
    "async-evalsha": ("one bare async EVALSHA (the async floor)",
                      "the same view, plus `await client.evalsha()` of the INCR script on a redis.asyncio client "
                      "of ratelimit_app (connection.get_async_redis(): same timeouts, no retries), one per event "
                      "loop, with the client IP as key"),
    "async-ours": ("ratelimit_app middleware, async",
                   _OURS.format(ip=IP_ALGORITHM) + "; under ASGI the middleware and its process_view are "
                   "coroutines deciding on the event loop (limiting_async.limit_request, get_async_limiter())"),
    "sync-ours": ("ratelimit_app middleware, sync under ASGI (today's path)",
                  "the same limits through a subclass of RateLimitMiddleware with async_capable = False "
                  "(bench.httpapp.middleware): Django runs it in a thread (sync_to_async) with the sync engine, "
                  "and the async view from there back on the event loop (async_to_sync)"),
}

#: The variant of bench/gateway_bench.py: /api/ping is the floor (one bare EVALSHA), /ratelimit/ the gateway
#: endpoint, behind nginx (one trusted proxy) with a per-IP limit no run reaches.
GATEWAY_VARIANT = "gateway"

#: The middleware of each variant that has one.
_MIDDLEWARE = {"ours": "ratelimit_app.middleware.RateLimitMiddleware",
               "async-ours": "ratelimit_app.middleware.RateLimitMiddleware",
               "sync-ours": "bench.httpapp.middleware.SyncOnlyRateLimitMiddleware"}


def configure(settings: dict[str, Any], variant: str) -> None:
    """Apply `variant` to the settings module namespace `settings` (raises ValueError for unknown names)."""
    if variant not in VARIANTS and variant not in ASGI_VARIANTS and variant != GATEWAY_VARIANT:
        raise ValueError(f"BENCH_HTTP_VARIANT={variant!r}; expected one of "
                         f"{', '.join([*VARIANTS, *ASGI_VARIANTS, GATEWAY_VARIANT])}")
    if variant == GATEWAY_VARIANT:
        settings["RATELIMIT"] = {**settings["RATELIMIT"], "IP_RATE": HUGE_RATE, "TRUSTED_PROXIES": 1}
    if variant in _MIDDLEWARE:
        settings["MIDDLEWARE"] = [_MIDDLEWARE[variant]]
        settings["RATELIMIT"] = {
            **settings["RATELIMIT"],
            "IP_RATE": HUGE_RATE,
            "PATH_PREFIXES": ["/api/"],
        }
