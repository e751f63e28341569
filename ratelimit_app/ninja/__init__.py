"""Rate limiting for Django Ninja APIs: throttles for `NinjaAPI(throttle=...)`, `Router(throttle=...)` and
`@api.get(..., throttle=...)`, decided atomically in Redis (install with the `[ninja]` extra).

    from ninja import NinjaAPI
    from ratelimit_app.ninja import AnonRateThrottle, TierRateThrottle

    api = NinjaAPI(throttle=TierRateThrottle())

    @api.get("/search", throttle=[TierRateThrottle(), AnonRateThrottle("10/m")])
    def search(request, q: str): ...

- `TierRateThrottle(scope=None)`: the client's tier (API key, user, anonymous tier), as
  RateLimitMiddleware enforces it; `scope` selects the tier's scoped limits.
- `AnonRateThrottle`, `AuthRateThrottle`, `UserRateThrottle`: drop-ins for ninja.throttling's, and
  subclasses of them: same constructor (`AnonRateThrottle("10/m")`, or the scope's rate in
  NINJA_DEFAULT_THROTTLE_RATES), same identities (Ninja's `request.auth`, the user, the client's
  address), same overridable methods, but each decision atomic in Redis. `AtomicRateThrottle` is their
  base, for throttles of your own (`get_cache_key(request)`).

All of our throttles on one operation, the operation's own `@ratelimit`, and RateLimitMiddleware's
per-IP and tier limits are decided in ONE all-or-nothing call, so a request refused by any of them is
charged to none (the middleware leaves an operation with our throttles to them). Refused over a rate,
the request gets Ninja's 429 (`{"detail": "Too many requests."}` and `Retry-After`, or the API's own
handler of `ninja.errors.Throttled`), or ours with RATELIMIT['NINJA_ERROR_FORMAT'] = "ratelimit";
refused for another reason (an unusable API key: 401, a deny rule: 403, the limiter unavailable or the
load shed: 503), it gets our answer (ratelimit_app.ninja.refusals). RateLimitMiddleware adds the rate
limit headers to Ninja's responses and gives back concurrency slots. docs/usage.md has the walk-through.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

try:
    import ninja  # noqa: F401
except ImportError as exc:
    raise ImproperlyConfigured(
        "ratelimit_app.ninja needs django-ninja: pip install 'django-ninja>=1.7' (or install this package "
        "with its [ninja] extra)"
    ) from exc

from .throttles import AnonRateThrottle, AtomicRateThrottle, AuthRateThrottle, TierRateThrottle, UserRateThrottle

__all__ = ["AnonRateThrottle", "AtomicRateThrottle", "AuthRateThrottle", "TierRateThrottle", "UserRateThrottle"]
