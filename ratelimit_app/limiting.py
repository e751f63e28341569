"""The stable import path of request limiting for views that decide for themselves
(`from ratelimit_app.limiting import limit_request, LimitOutcome`).

The code lives in ratelimit_app.apply.limiting and ratelimit_app.apply.outcome; this module
re-exports their public names.
"""

from __future__ import annotations

from .apply.limiting import alimit_request, asafely, limit_request, safely
from .apply.outcome import LimitOutcome

__all__ = ["LimitOutcome", "alimit_request", "asafely", "limit_request", "safely"]
