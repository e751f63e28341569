"""ratelimit_app.urls: `include("ratelimit_app.urls")` serves GET /metrics (named "ratelimit_metrics")
and nothing else; the dashboard has its own include."""

from __future__ import annotations

from typing import Any

from django.test import Client
from django.urls import resolve, reverse

from ratelimit_app import urls
from ratelimit_app.observability.metrics_endpoint import metrics_view


def test_it_routes_metrics_and_nothing_else() -> None:
    assert [(str(p.pattern), p.name) for p in urls.urlpatterns] == [("metrics", "ratelimit_metrics")]


def test_the_demo_includes_it_at_the_root() -> None:
    assert reverse("ratelimit_metrics") == "/metrics"
    assert resolve("/metrics").func is metrics_view


def test_the_included_route_answers_the_metrics_view(client: Client, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_TOKEN": None, "METRICS_ALLOWED_IPS": ["127.0.0.1"]}
    response = client.get(reverse("ratelimit_metrics"), REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200
    assert b"ratelimit_breaker_state" in response.content
