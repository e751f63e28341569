"""ratelimit_app: distributed API rate limiting for Django, decided atomically in Redis."""

from .core.decision import Decision, PolicyResult
from .core.engine import new_lease_token
from .core.engine_async import AsyncRateLimiter
from .core.engine_sync import RateLimiter
from .core.exceptions import BackendError, RateLimiterError
from .core.policies import InvalidPolicy, Policy, parse_rate
from .core.usage import Reservation

__all__ = [
    "AsyncRateLimiter", "BackendError", "Decision", "InvalidPolicy", "Policy", "PolicyResult", "RateLimiter",
    "RateLimiterError", "Reservation", "new_lease_token", "parse_rate",
]
__version__ = "0.1.0"
