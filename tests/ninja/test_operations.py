"""RateLimitMiddleware and Django Ninja operations: the middleware reads the `@limit_cost`, `@ratelimit`
and `@limit_concurrency` of the operation a request reaches (one Django view serves every method of a
path), leaves an operation with our throttles to them (one call, charged once), and Ninja's docs and
schema can be left unlimited."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.http import HttpRequest
from django.test import RequestFactory
from django.urls import path
from ninja import NinjaAPI
from ninja.security import APIKeyHeader

from devtools.embedded import RedisProcess
from ratelimit_app.apply.routes import ResolvedView, resolve_view
from ratelimit_app.decorators import limit_cost, ratelimit
from ratelimit_app.ninja import AnonRateThrottle, TierRateThrottle
from ratelimit_app.ninja.operations import operation_for

from ..support.limits_support import make_key, make_tier, parse_ietf
from ..support.topology import command_calls

pytestmark = pytest.mark.urls(__name__)

api = NinjaAPI(urls_namespace="ninja-operations")


class Token(APIKeyHeader):
    param_name = "X-Token"

    def authenticate(self, request: HttpRequest, key: str | None) -> str | None:
        return key if key == "good" else None


@api.get("/plain")
def plain(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/item")
@limit_cost(3)
def read_item(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.post("/item")
@limit_cost(5)
def write_item(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/throttled", throttle=AnonRateThrottle("2/m"))
def throttled(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/tier", throttle=[TierRateThrottle(), AnonRateThrottle("2/m")])
def tier(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/guarded", auth=Token(), throttle=AnonRateThrottle("5/m"))
def guarded(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/decorated")
@ratelimit(rate="1/m", key="ip")
def decorated(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


urlpatterns = [path("api/ninja/", api.urls)]


@pytest.fixture
def key(db: Any) -> str:
    return make_key(make_tier("roomy", [("minute", "sliding_window", 20, 60, None, "")]))


def remaining(response: Any) -> dict[str, int]:
    return {name: params["r"] for name, params in parse_ietf(response["RateLimit"]).items()}


def test_an_operation_without_our_throttles_is_limited_by_the_middleware(client: Any, key: str) -> None:
    responses = [client.get("/api/ninja/plain", HTTP_X_API_KEY=key) for _ in range(2)]
    assert [r.status_code for r in responses] == [200, 200]
    assert [remaining(r)["minute"] for r in responses] == [19, 18]


def test_limit_cost_of_the_operation_the_method_reaches(client: Any, key: str) -> None:
    read = client.get("/api/ninja/item", HTTP_X_API_KEY=key)
    write = client.post("/api/ninja/item", HTTP_X_API_KEY=key)
    assert (read.status_code, write.status_code) == (200, 200)
    assert (remaining(read)["minute"], remaining(write)["minute"]) == (17, 12)


def test_a_throttled_operation_is_charged_once_with_the_middlewares_limits(client: Any, key: str) -> None:
    responses = [client.get("/api/ninja/throttled", HTTP_X_API_KEY=key) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    # one call per request: the per-IP limit and the tier counted once each, the refused request not at all
    assert [remaining(r)["ip"] for r in responses] == [99, 98, 98]
    assert [remaining(r)["minute"] for r in responses] == [19, 18, 18]
    assert responses[2].json() == {"detail": "Too many requests."}


def test_the_tier_and_a_drop_in_under_the_middleware_cost_one_call_per_request(client: Any, key: str,
                                                                                settings: Any,
                                                                                server: RedisProcess) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url}
    counter = redis.Redis(port=server.port)
    try:
        assert client.get("/api/ninja/tier", HTTP_X_API_KEY=key).status_code == 200  # loads the script
        before = command_calls(counter, "evalsha")
        assert client.get("/api/ninja/tier", HTTP_X_API_KEY=key).status_code == 200
        assert command_calls(counter, "evalsha") - before == 1  # per-IP, tier and AnonRateThrottle: one call
    finally:
        counter.close()


def test_the_request_limits_refusal_comes_from_the_throttles(client: Any, key: str) -> None:
    refused = client.get("/api/ninja/throttled")  # no key and no ANONYMOUS_TIER
    assert refused.status_code == 401 and refused.json() == {"error": "API key required"}
    assert remaining(refused)["ip"] == 99  # charged to the per-IP limit only
    assert client.get("/api/ninja/throttled", HTTP_X_API_KEY=key).status_code == 200  # the 401 took no anon unit


def test_tier_and_drop_in_together(client: Any, key: str) -> None:
    responses = [client.get("/api/ninja/tier", HTTP_X_API_KEY=key) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert [remaining(r)["minute"] for r in responses] == [19, 18, 18]


def test_a_request_ninjas_authentication_refuses_is_charged_once_on_the_way_out(client: Any, key: str) -> None:
    refused = client.get("/api/ninja/guarded", HTTP_X_API_KEY=key)
    assert refused.status_code == 401 and refused.json() == {"detail": "Unauthorized"}
    assert remaining(refused)["minute"] == 19
    allowed = client.get("/api/ninja/guarded", HTTP_X_API_KEY=key, HTTP_X_TOKEN="good")
    assert allowed.status_code == 200 and remaining(allowed)["minute"] == 18


def test_the_operations_ratelimit_joins_the_middlewares_call(client: Any, key: str) -> None:
    first = client.get("/api/ninja/decorated", HTTP_X_API_KEY=key)
    second = client.get("/api/ninja/decorated", HTTP_X_API_KEY=key)
    assert (first.status_code, second.status_code) == (200, 429)
    assert "decorated" in parse_ietf(first["RateLimit-Policy"])  # decided in the middleware's call
    assert remaining(second)["minute"] == 19  # refused by the operation's limit: the tier is not charged


@pytest.mark.django_db
def test_ninjas_docs_and_schema_left_unlimited_with_exempt_paths(client: Any, settings: Any) -> None:
    assert client.get("/api/ninja/openapi.json").status_code == 401  # limited like any /api/ path
    settings.RATELIMIT = {**settings.RATELIMIT, "EXEMPT_PATHS": ["/health", "/api/ninja/docs",
                                                                 "/api/ninja/openapi.json"],
                          "IP_RATE": "2/m"}
    responses = [client.get(url) for url in ["/api/ninja/openapi.json", "/api/ninja/docs"] * 3]
    assert [r.status_code for r in responses] == [200] * 6
    assert not any("X-RateLimit-Limit" in r for r in responses)
    assert client.get("/api/ninja/plain").status_code == 401  # the API itself is still limited


def test_only_ninja_views_are_resolved() -> None:
    request = RequestFactory().get("/")
    assert resolve_view(plain, request) == ResolvedView(plain, False) and operation_for(plain, request) is None
    match = __import__("django.urls", fromlist=["resolve"]).resolve("/api/ninja/item")
    assert resolve_view(match.func, request) == ResolvedView(read_item, False)
    throttled_view = __import__("django.urls", fromlist=["resolve"]).resolve("/api/ninja/throttled").func
    assert resolve_view(throttled_view, request) == ResolvedView(throttled, True)  # our throttles decide
    assert operation_for(match.func, request).view_func is read_item  # type: ignore[union-attr]
    assert operation_for(match.func, RequestFactory().post("/")).view_func is write_item  # type: ignore[union-attr]
    assert operation_for(match.func, RequestFactory().delete("/")) is None  # Ninja answers 405
