"""The stable import path of the DRF throttles (`"ratelimit_app.throttling.UserRateThrottle"` in
REST_FRAMEWORK's DEFAULT_THROTTLE_CLASSES, and the others).

The code lives in ratelimit_app.apply.throttling and ratelimit_app.apply.jointthrottle; this module
re-exports their public names.
"""

from __future__ import annotations

from .apply.jointthrottle import ClientRefused, InvalidApiKey, LimiterUnavailable, Overloaded, RateLimitHeadersMixin
from .apply.throttling import (
    AnonRateThrottle,
    AtomicRateThrottle,
    ConcurrencyThrottle,
    ScopedRateThrottle,
    TierRateThrottle,
    UserRateThrottle,
    check_throttle_settings,
    parse_throttle_rate,
)

__all__ = [
    "AnonRateThrottle", "AtomicRateThrottle", "ClientRefused", "ConcurrencyThrottle", "InvalidApiKey",
    "LimiterUnavailable", "Overloaded", "RateLimitHeadersMixin", "ScopedRateThrottle", "TierRateThrottle",
    "UserRateThrottle", "check_throttle_settings", "parse_throttle_rate",
]
