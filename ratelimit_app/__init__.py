"""ratelimit_app: distributed API rate limiting for Django, decided atomically in Redis."""

from .decision import Decision, PolicyResult
from .engine import new_lease_token
from .engine_async import AsyncRateLimiter
from .engine_sync import RateLimiter
from .exceptions import BackendError, RateLimiterError
from .policies import InvalidPolicy, Policy, parse_rate

__all__ = [
    "AsyncRateLimiter", "BackendError", "Decision", "InvalidPolicy", "Policy", "PolicyResult", "RateLimiter",
    "RateLimiterError", "new_lease_token", "parse_rate",
]
__version__ = "0.1.0"
