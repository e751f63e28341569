"""How a NinjaAPI answers requests our throttles refuse: the API's own answer to Throttled (Ninja's
format, or the project's handler) with our headers, or our 429 by setting; our 401, 403 and 503."""

from __future__ import annotations

from typing import Any

import ninja.throttling as ninja_throttling
import pytest
from django.http import HttpRequest, HttpResponse
from django.urls import path
from ninja import NinjaAPI
from ninja.errors import Throttled

from devtools.embedded import free_port
from ratelimit_app.models import ClientRule
from ratelimit_app.ninja import AnonRateThrottle, TierRateThrottle

pytestmark = pytest.mark.urls(__name__)

api = NinjaAPI(urls_namespace="ninja-refusals")
custom = NinjaAPI(urls_namespace="ninja-refusals-custom")


@custom.exception_handler(Throttled)
def slow_down(request: HttpRequest, exc: Throttled) -> HttpResponse:
    return custom.create_response(request, {"message": "slow down", "wait": exc.wait}, status=429)


@api.get("/anon", throttle=AnonRateThrottle("1/m"))
def anon(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/never", throttle=AnonRateThrottle("0/m"))
def never(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/tier", throttle=TierRateThrottle())
def tier(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/theirs", throttle=ninja_throttling.AnonRateThrottle("1/m"))
def theirs(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@custom.get("/anon", throttle=AnonRateThrottle("1/m"))
def custom_anon(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


urlpatterns = [path("ninja/", api.urls), path("custom/", custom.urls)]


def test_a_refusal_over_a_rate_is_ninjas_answer_with_our_headers(client: Any) -> None:
    assert client.get("/ninja/anon").status_code == 200
    denied = client.get("/ninja/anon")
    assert denied.status_code == 429 and denied.json() == {"detail": "Too many requests."}
    assert denied["X-RateLimit-Limit"] == "1" and denied["X-RateLimit-Remaining"] == "0"
    assert 1 <= int(denied["Retry-After"]) <= 60


def test_our_429_body_by_setting(client: Any, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "NINJA_ERROR_FORMAT": "ratelimit"}
    client.get("/ninja/anon")
    denied = client.get("/ninja/anon")
    assert denied.status_code == 429
    body = denied.json()
    assert body["error"] == "rate limit exceeded" and body["policy"] == "anon"
    assert int(denied["Retry-After"]) == max(1, -(-body["retry_after"] // 1))
    settings.RATELIMIT = {**settings.RATELIMIT, "ERROR_FORMAT": "problem"}
    problem = client.get("/ninja/anon")
    assert problem["Content-Type"] == "application/problem+json" and problem.json()["violated-policies"] == ["anon"]


def test_a_rate_of_zero_refuses_every_request_with_ninjas_answer(client: Any, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "NINJA_ERROR_FORMAT": "ratelimit"}
    response = client.get("/ninja/never")
    assert response.status_code == 429 and response.json() == {"detail": "Too many requests."}
    assert "Retry-After" not in response  # waiting never helps


def test_the_apis_own_handler_answers_our_refusals(client: Any) -> None:
    client.get("/custom/anon")
    denied = client.get("/custom/anon")
    assert denied.status_code == 429 and denied.json()["message"] == "slow down"
    assert 0 < denied.json()["wait"] <= 60 and denied["X-RateLimit-Remaining"] == "0"


def test_ninjas_own_throttles_keep_ninjas_answer(client: Any, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "NINJA_ERROR_FORMAT": "ratelimit"}
    client.get("/ninja/anon"), client.get("/ninja/anon")  # our handler is now the API's
    client.get("/ninja/theirs")
    denied = client.get("/ninja/theirs")
    assert denied.status_code == 429 and denied.json() == {"detail": "Too many requests."}
    assert "X-RateLimit-Limit" not in denied


@pytest.mark.django_db
def test_an_unusable_key_is_a_401(client: Any) -> None:
    missing = client.get("/ninja/tier")
    assert missing.status_code == 401 and missing.json() == {"error": "API key required"}
    assert missing["WWW-Authenticate"] == 'Bearer realm="api"' and "Retry-After" not in missing
    malformed = client.get("/ninja/tier", HTTP_X_API_KEY="x" * 500)
    assert malformed.status_code == 401 and malformed.json() == {"error": "malformed API key"}
    assert "xxxxx" not in malformed.content.decode()


@pytest.mark.django_db
def test_a_deny_rule_is_a_403(client: Any, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "ANONYMOUS_TIER": "free", "REQUIRE_API_KEY": False}
    ClientRule.objects.create(network="127.0.0.0/8", action="deny", note="test")
    refused = client.get("/ninja/tier")
    assert refused.status_code == 403 and "access rule" in refused.json()["error"]


@pytest.mark.parametrize(("mode", "status"), [("open", 200), ("closed", 503)])
def test_the_fail_mode_when_redis_is_down(client: Any, settings: Any, mode: str, status: int) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                          "FAIL_MODE": mode, "BUDGET_MS": 500}
    response = client.get("/ninja/anon")
    assert response.status_code == status
    if status == 503:
        assert response.json()["error"] == "rate limiter unavailable" and int(response["Retry-After"]) >= 1
