"""Opt-in URLs of ratelimit_app: `path("", include("ratelimit_app.urls"))` serves GET /metrics.

The admin dashboard has its own include, to be placed before `admin.site.urls`:
`path("admin/", include("ratelimit_app.dashboard"))` (see ratelimit_app.dashboard).
"""

from __future__ import annotations

from django.urls import path

from .prometheus import metrics_view

urlpatterns = [
    path("metrics", metrics_view, name="ratelimit_metrics"),
]
