"""ratelimit_app: distributed API rate limiting for Django, decided atomically in Redis."""

from .decision import Decision, PolicyResult
from .engine import RateLimiter
from .policies import InvalidPolicy, Policy, parse_rate

__all__ = ["Decision", "InvalidPolicy", "Policy", "PolicyResult", "RateLimiter", "parse_rate"]
__version__ = "0.1.0"
