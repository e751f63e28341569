"""The stable import path of the app's structured logging (`ratelimit_app.logs.JsonFormatter` in LOGGING).

The code lives in ratelimit_app.observability.logs; this module re-exports its public names.
"""

from __future__ import annotations

from .observability.logs import (
    JsonFormatter,
    log_breaker_change,
    log_config_error,
    log_denial,
    log_event,
    logger,
    mask_key,
    safe_identity,
)

__all__ = ["JsonFormatter", "log_breaker_change", "log_config_error", "log_denial", "log_event", "logger",
           "mask_key", "safe_identity"]
