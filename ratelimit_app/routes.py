"""The stable import path of `@limit_cost` (`from ratelimit_app.routes import limit_cost`).

The code lives in ratelimit_app.apply.routes; this module re-exports its public names.
"""

from __future__ import annotations

from .apply.routes import VIEW_LIMIT_ATTRIBUTE, limit_cost

__all__ = ["VIEW_LIMIT_ATTRIBUTE", "limit_cost"]
