"""The stable import path of the middleware (`"ratelimit_app.middleware.RateLimitMiddleware"` in MIDDLEWARE).

The code lives in ratelimit_app.apply.middleware; this module re-exports its public names.
"""

from __future__ import annotations

from .apply.middleware import REQUEST_ATTRIBUTE, RateLimitMiddleware

__all__ = ["REQUEST_ATTRIBUTE", "RateLimitMiddleware"]
