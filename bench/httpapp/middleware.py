"""The sync-only build of our middleware: today's path under ASGI, for the "sync-ours" variant."""

from __future__ import annotations

from ratelimit_app.middleware import RateLimitMiddleware


class SyncOnlyRateLimitMiddleware(RateLimitMiddleware):
    """RateLimitMiddleware declared sync only: under ASGI Django runs it in a thread (sync_to_async),
    deciding with the sync engine, as every Django rate limiter without async support is run."""

    async_capable = False
