"""The stable import path of the view decorators (`from ratelimit_app.decorators import ratelimit`).

The code lives in ratelimit_app.apply.decorators; this module re-exports its public names.
"""

from __future__ import annotations

from .apply.decorators import limit_concurrency, ratelimit

__all__ = ["limit_concurrency", "ratelimit"]
