"""Opt-in URLs: `path("", include("ratelimit_app.urls"))` serves GET /metrics (docs/observability.md)."""

from __future__ import annotations

from django.urls import path

from .observability.metrics_endpoint import metrics_view

urlpatterns = [
    path("metrics", metrics_view, name="ratelimit_metrics"),
]
