"""Opt-in URLs of ratelimit_app: `path("", include("ratelimit_app.urls"))` serves GET /metrics (Prometheus;
for staff sessions, RATELIMIT['METRICS_TOKEN'] and RATELIMIT['METRICS_ALLOWED_IPS'] only).

The admin dashboard has its own include, to be placed before `admin.site.urls`:
`path("admin/", include("ratelimit_app.observability.dashboard"))` (see ratelimit_app.observability.dashboard).
"""

from __future__ import annotations

from django.urls import path

from .observability.metrics_endpoint import metrics_view

urlpatterns = [
    path("metrics", metrics_view, name="ratelimit_metrics"),
]
