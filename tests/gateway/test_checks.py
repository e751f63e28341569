"""ratelimit.W003: the middleware would limit the gateway endpoint itself."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import include, path

from project.urls import urlpatterns as demo_urlpatterns
from ratelimit_app.gateway.checks import check_gateway_paths, routed_paths

urlpatterns = [*demo_urlpatterns, path("api/gateway/", include("ratelimit_app.gateway.urls"))]


def test_the_demo_routes_the_endpoint_outside_the_limited_paths() -> None:
    assert routed_paths() == ["/ratelimit/authorize", "/ratelimit/auth-request", "/ratelimit/confirm",
                             "/ratelimit/release"]
    assert check_gateway_paths() == []


@pytest.mark.urls(__name__)
def test_an_endpoint_under_the_limited_paths_is_a_warning(settings: Any) -> None:
    [warning] = check_gateway_paths()
    assert warning.id == "ratelimit.W003" and "/api/gateway/authorize" in warning.msg
    settings.RATELIMIT = {**settings.RATELIMIT, "EXEMPT_PATHS": ["/health", "/api/gateway/"]}
    assert check_gateway_paths() == []
    settings.RATELIMIT = {**settings.RATELIMIT, "EXEMPT_PATHS": ["/health"], "ENABLED": False}
    assert check_gateway_paths() == []


@pytest.mark.urls(__name__)
def test_the_endpoints_path_is_matched_by_segment(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "PATH_PREFIXES": ["/api/gate"], "EXEMPT_PATHS": []}
    assert check_gateway_paths() == []  # "/api/gate" is not "/api/gateway"
    settings.RATELIMIT = {**settings.RATELIMIT, "PATH_PREFIXES": ["/api/"], "EXEMPT_PATHS": ["/api/gate"]}
    assert [warning.id for warning in check_gateway_paths()] == ["ratelimit.W003"]
