"""ratelimit.W003: the middleware would limit the gateway endpoint itself; RATELIMIT['GATEWAY_FIRST_LEASE']
validated (ratelimit.E001)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.urls import include, path

from project.urls import urlpatterns as demo_urlpatterns
from ratelimit_app.conf.settings import ratelimit_settings, read_settings
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


@pytest.mark.parametrize("value", [0, 0.05, -1, 3601, "5", True])
def test_check_reports_a_first_lease_that_is_not_seconds_from_a_tenth_to_an_hour(settings: Any, value: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "GATEWAY_FIRST_LEASE": value}
    errors = read_settings()[1]
    assert [error.setting for error in errors] == ["GATEWAY_FIRST_LEASE"]
    assert "0.1 to 3600" in errors[0].message
    with pytest.raises(SystemCheckError, match=r"ratelimit.E001.*GATEWAY_FIRST_LEASE"):
        call_command("check")
    # a server started anyway holds a gateway's slots their full lease (the cautious reading)
    assert ratelimit_settings.GATEWAY_FIRST_LEASE is None


@pytest.mark.parametrize("value", [None, 0.1, 2, 3600])
def test_a_first_lease_of_seconds_or_none_is_accepted(settings: Any, value: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "GATEWAY_FIRST_LEASE": value}
    assert read_settings()[1] == [] and ratelimit_settings.GATEWAY_FIRST_LEASE == value
