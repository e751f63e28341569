"""The stable import path of the Prometheus exposition (`ratelimit_app.prometheus.registry`).

The code lives in ratelimit_app.observability.prometheus; this module re-exports its public names.
Like it, importing this module without prometheus-client raises ImproperlyConfigured.
"""

from __future__ import annotations

from .observability.prometheus import CONTENT_TYPE_LATEST, RateLimitCollector, exposition, metrics_view, registry

__all__ = ["CONTENT_TYPE_LATEST", "RateLimitCollector", "exposition", "metrics_view", "registry"]
