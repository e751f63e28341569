"""The HTTP variants: what stands between gunicorn and the trivial view in each run.

`configure(settings, variant)` adjusts the bench settings module for one variant; `VARIANTS`
describes them for the report. Every variant serves GET /api/ping with the same small JSON body,
and every limiter is configured with a limit high enough that nothing is denied during the run.
"""

from __future__ import annotations

from typing import Any

from ratelimit_app.conf import DEFAULTS

#: The limit each peer gets in the HTTP runs: far above what a run can send, so nothing is denied.
HUGE_RATE = "1000000/m"

#: The per-IP algorithm the middleware variant runs with: the default, not set by the bench settings.
IP_ALGORITHM = DEFAULTS["IP_ALGORITHM"]

#: variant -> (label, what is configured), in report order.
VARIANTS: dict[str, tuple[str, str]] = {
    "none": ("no limiter", "plain Django view returning JsonResponse; no middleware"),
    "evalsha": ("one bare EVALSHA (the floor)",
                "the same view, plus client.evalsha() of the INCR script on ratelimit_app's Redis client "
                "(connection.get_redis(): same timeouts, no retries) with the client IP as key"),
    "ours": ("ratelimit_app middleware",
             f"RateLimitMiddleware: per-IP limit (IP_RATE, {IP_ALGORITHM}) + the API key's tier (3 policies "
             "shaped like the free tier: token_bucket, sliding_window, fixed_window; huge limits) decided "
             "in one EVALSHA, rate-limit headers on the response"),
    "drf-none": ("DRF APIView, no throttle", "DRF APIView returning Response; no throttle (DRF's own cost)"),
    "drf": ("DRF AnonRateThrottle", f"the DRF APIView with AnonRateThrottle at {HUGE_RATE} on the django-redis cache"),
    "django-ratelimit": ("django-ratelimit",
                         f"the plain view under @ratelimit(key='ip', rate='{HUGE_RATE}', block=True), "
                         "django-redis cache"),
    "smart": ("django-smart-ratelimit",
              f"the plain view under @rate_limit(key='ip', rate='{HUGE_RATE}'), Redis backend, "
              "default algorithm (sliding_window)"),
}


def configure(settings: dict[str, Any], variant: str) -> None:
    """Apply `variant` to the settings module namespace `settings` (raises ValueError for unknown names)."""
    if variant not in VARIANTS:
        raise ValueError(f"BENCH_HTTP_VARIANT={variant!r}; expected one of {', '.join(VARIANTS)}")
    if variant == "ours":
        settings["MIDDLEWARE"] = ["ratelimit_app.middleware.RateLimitMiddleware"]
        settings["RATELIMIT"] = {
            **settings["RATELIMIT"],
            "IP_RATE": HUGE_RATE,
            "PATH_PREFIXES": ["/api/"],
        }
