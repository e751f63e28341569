"""Rate limiting for Django Ninja APIs (the `[ninja]` extra; docs/usage.md, "Django Ninja", is the
manual): throttles for `NinjaAPI(throttle=...)`, `Router(throttle=...)` and `@api.get(..., throttle=...)`,
decided atomically in Redis, all of ours on one operation in one call with the request's own limits.
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
