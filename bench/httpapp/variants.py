"""The HTTP variants: what stands between the server and the trivial view in each run.

`configure(settings, variant)` adjusts the bench settings module for one variant; `VARIANTS` (served
by gunicorn, a plain view) and `ASGI_VARIANTS` (served by uvicorn, an `async def` view) describe them
for the report. Every variant serves GET /api/ping with the same small JSON body, and every limiter
is configured with a limit high enough that nothing is denied during the run.
"""

from __future__ import annotations

from typing import Any

from ratelimit_app.conf.settings import DEFAULTS

#: The per-IP rate of ours and of the reference: far above what a run sends from its one address.
HUGE_RATE = "1000000/m"
#: The limit each peer gets per API key: the seeded enterprise tier's per-minute limit, which no key
#: reaches in a round (the keys take turns), as a user of the peer would give each client its plan's rate.
PEER_RATE = "2000/m"

#: The per-IP algorithm the middleware variant runs with: the default, not set by the bench settings.
IP_ALGORITHM = DEFAULTS["IP_ALGORITHM"]

#: What our middleware variants configure (the gunicorn one and both ASGI ones).
_OURS = ("RateLimitMiddleware with the default settings: per-IP limit (IP_RATE, {ip}) + the API key's seeded "
         "tier (enterprise as migrate makes it: token_bucket, sliding_window, fixed_window) decided in one EVALSHA, "
         "rate-limit headers on the response, metrics on")

#: What the reference variants run (bench/httpapp/reference.py).
_REFERENCE = ("a plain hand-written middleware doing what ours does for this request and nothing else: the API key "
              "-> its tier (kept in a dict once read), the same EVALSHA of decide.lua (same KEYS and ARGV) on a "
              "redis-py connection of its own, the same six headers, a count per request added to Redis in batches")

#: variant -> (label, what is configured), in report order.
VARIANTS: dict[str, tuple[str, str]] = {
    "none": ("no limiter", "plain Django view returning JsonResponse; no middleware"),
    "evalsha": ("one bare EVALSHA (the floor)",
                "the same view, plus client.evalsha() of the INCR script on ratelimit_app's Redis client "
                "(connection.get_redis(): same timeouts, no retries) with the client IP as key"),
    "reference": ("lean reference middleware (what the features cost)", _REFERENCE),
    "ours": ("ratelimit_app middleware", _OURS.format(ip=IP_ALGORITHM)),
    "drf-none": ("DRF APIView, no throttle", "DRF APIView returning Response; no throttle (DRF's own cost)"),
    "drf": ("DRF throttle", "the DRF APIView with a SimpleRateThrottle keyed by the X-API-Key header (DRF's documented "
            f"custom throttle), scope rate {PEER_RATE} in DEFAULT_THROTTLE_RATES, on the django-redis cache"),
    "django-ratelimit": ("django-ratelimit",
                         f"the plain view under @ratelimit(key='header:x-api-key', rate='{PEER_RATE}', block=True), "
                         "django-redis cache"),
    "smart": ("django-smart-ratelimit",
              f"the plain view under @rate_limit(key='header:X-API-Key', rate='{PEER_RATE}'), Redis backend, "
              "default algorithm (sliding_window)"),
}

#: ASGI variant -> (label, what is configured), in report order. Each serves the same `async def` view.
ASGI_VARIANTS: dict[str, tuple[str, str]] = {
    "async-none": ("async view, no limiter", "`async def` view returning JsonResponse; no middleware"),
    "async-evalsha": ("one bare async EVALSHA (the async floor)",
                      "the same view, plus `await client.evalsha()` of the INCR script on a redis.asyncio client "
                      "of ratelimit_app (connection.get_async_redis(): same timeouts, no retries), one per event "
                      "loop, with the client IP as key"),
    "async-reference": ("lean reference middleware, async", _REFERENCE + "; awaiting redis.asyncio"),
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
               "sync-ours": "bench.httpapp.middleware.SyncOnlyRateLimitMiddleware",
               "reference": "bench.httpapp.reference.ReferenceMiddleware",
               "async-reference": "bench.httpapp.reference.AsyncReferenceMiddleware"}


def configure(settings: dict[str, Any], variant: str) -> None:
    """Apply `variant` to the settings module namespace `settings` (raises ValueError for unknown names)."""
    if variant not in VARIANTS and variant not in ASGI_VARIANTS and variant != GATEWAY_VARIANT:
        raise ValueError(f"BENCH_HTTP_VARIANT={variant!r}; expected one of "
                         f"{', '.join([*VARIANTS, *ASGI_VARIANTS, GATEWAY_VARIANT])}")
    if variant == GATEWAY_VARIANT:
        settings["RATELIMIT"] = {**settings["RATELIMIT"], "IP_RATE": HUGE_RATE, "TRUSTED_PROXIES": 1}
    if variant == "drf":
        settings["REST_FRAMEWORK"] = {**settings["REST_FRAMEWORK"], "DEFAULT_THROTTLE_RATES": {"apikey": PEER_RATE}}
    if variant in _MIDDLEWARE:
        settings["MIDDLEWARE"] = [_MIDDLEWARE[variant]]
        settings["RATELIMIT"] = {
            **settings["RATELIMIT"],
            "IP_RATE": HUGE_RATE,
            "PATH_PREFIXES": ["/api/"],
        }
