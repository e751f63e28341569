"""`@ratelimit` on plain Django views, and `@ratelimit` / `@limit_concurrency` on Django Ninja operations
(sync and async: whatever the operation returns, an allowed request is answered by Ninja and a refused
one by the limiter, never with a 500), against the real Redis."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import RequestFactory
from django.urls import path
from ninja import NinjaAPI, Schema
from ninja.responses import Status

from ratelimit_app import InvalidPolicy
from ratelimit_app.apply.admission import outcome_of
from ratelimit_app.apply.outcome import ALLOWED, DENIED
from ratelimit_app.decorators import limit_concurrency, limit_cost, ratelimit
from tests.support.limits_support import make_key, make_tier, parse_ietf

pytestmark = pytest.mark.urls(__name__)


@ratelimit(rate="2/m", key="ip")
def by_ip(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit(rate="2/m", key="ip")
def by_ip_too(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit(rate="1/m", key="user")
def by_user(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit(rate="1/m", key="header:x-device-id")
def by_header(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit(rate="1/m", key=lambda request: request.GET.get("account"))
def by_callable(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit(rate="1/m", key="ip", block=False)
def flagged(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"limited": request.limited})  # type: ignore[attr-defined]


@ratelimit(rate="3/5s", key="ip", algorithm="gcra", burst=2, name="smooth")
def smooth(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit(rate="2/m", key="ip", group="shared")
def shared_one(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit(rate="2/m", key="ip", group="shared")
def shared_two(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


api = NinjaAPI(urls_namespace="ninja-decorators")


class Item(Schema):
    name: str


@api.get("/data")
@ratelimit(rate="2/m", key="ip")
def data(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/async-data")
@ratelimit(rate="2/m", key="ip")
async def async_data(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/model", response=Item)
@ratelimit(rate="2/m", key="ip")
def model(request: HttpRequest) -> Item:
    return Item(name="a")


@api.get("/response")
@ratelimit(rate="2/m", key="ip")
def ninja_response(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"raw": True})


@api.post("/status", response={201: Item})
@ratelimit(rate="2/m", key="ip")
def created(request: HttpRequest) -> Status:
    return Status(201, Item(name="b"))


@api.get("/slot")
@limit_concurrency(1, key="ip")
def slot(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/async-slot")
@limit_concurrency(1, key="ip")
async def async_slot(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


urlpatterns = [
    path("shared1", shared_one), path("shared2", shared_two),
    path("ip", by_ip), path("ip2", by_ip_too), path("user", by_user), path("header", by_header),
    path("callable", by_callable), path("flagged", flagged), path("smooth", smooth), path("api/flagged", flagged),
    path("ninja/", api.urls),
]


def test_limits_per_ip_with_429_and_headers(client: Any) -> None:
    responses = [client.get("/ip") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["1", "0", "0"]
    denied = responses[-1]
    body = denied.json()
    assert set(body) == {"error", "tier", "policy", "retry_after"} and body["policy"] == "by_ip"
    assert int(denied["Retry-After"]) == max(1, math.ceil(body["retry_after"]))
    assert parse_ietf(denied["RateLimit-Policy"]) == {"by_ip": {"q": 2, "w": 60}}
    assert client.get("/ip", REMOTE_ADDR="198.51.100.7").status_code == 200  # another client


def test_each_decorated_view_counts_separately(client: Any) -> None:
    assert [client.get("/ip").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/ip2").status_code == 200


def test_views_of_one_group_share_a_counter(client: Any) -> None:
    assert client.get("/shared1").status_code == 200
    assert client.get("/shared2").status_code == 200
    denied = client.get("/shared1")
    assert denied.status_code == 429 and denied.json()["policy"] == "shared"


@pytest.mark.django_db
def test_key_user_counts_users_and_falls_back_to_ip(client: Any, django_user_model: Any) -> None:
    client.force_login(django_user_model.objects.create_user("alice", password="pw"))
    assert [client.get("/user").status_code for _ in range(2)] == [200, 429]
    client.force_login(django_user_model.objects.create_user("bob", password="pw"))
    assert client.get("/user").status_code == 200
    client.logout()
    assert [client.get("/user").status_code for _ in range(2)] == [200, 429]


def test_key_header(client: Any) -> None:
    assert [client.get("/header", HTTP_X_DEVICE_ID="a").status_code for _ in range(2)] == [200, 429]
    assert client.get("/header", HTTP_X_DEVICE_ID="b").status_code == 200
    assert [client.get("/header").status_code for _ in range(2)] == [200, 429]  # no header: one shared counter


def test_key_callable_and_none_means_unlimited(client: Any) -> None:
    assert [client.get("/callable?account=1").status_code for _ in range(2)] == [200, 429]
    assert client.get("/callable?account=2").status_code == 200
    assert all(client.get("/callable").status_code == 200 for _ in range(5))


def test_block_false_flags_the_request(client: Any) -> None:
    assert [client.get("/flagged").json()["limited"] for _ in range(3)] == [False, True, True]
    assert client.get("/flagged").status_code == 200


def test_algorithm_burst_and_name(client: Any) -> None:
    responses = [client.get("/smooth") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[-1].json()["policy"] == "smooth"
    assert responses[0]["X-RateLimit-Limit"] == "2"


def test_bad_declarations_fail_at_import_naming_the_view() -> None:
    def view(request: HttpRequest) -> JsonResponse:
        return JsonResponse({})

    with pytest.raises(InvalidPolicy, match="view"):
        ratelimit(rate="ten/m")(view)
    with pytest.raises(InvalidPolicy, match="burst"):
        ratelimit(rate="10/m", algorithm="fixed_window", burst=3)(view)
    with pytest.raises(ValueError, match=r"test_decorators\..*view: key"):
        ratelimit(rate="10/m", key="cookie")(view)
    for cost in (0, -1, 1.5, "x"):
        with pytest.raises(ValueError, match=r"view: cost"):
            ratelimit(rate="10/m", cost=cost)(view)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="view: block"):
        ratelimit(rate="10/m", block="yes")(view)  # type: ignore[arg-type]


def test_limit_cost_checks_its_arguments_when_applied_naming_the_view() -> None:
    def view(request: HttpRequest) -> JsonResponse:
        return JsonResponse({})

    for cost in (-1, 1.5, "x", True):
        with pytest.raises(ValueError, match=r"@limit_cost on .*view: cost"):
            limit_cost(cost)(view)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="view: scope"):
        limit_cost(1, scope="has space")(view)
    with pytest.raises(ValueError, match="view: methods"):
        limit_cost(1, methods="POST")(view)
    assert limit_cost(0)(view) is view  # report-only is a valid cost for a route


def test_redis_down_follows_the_fail_mode(client: Any, settings: Any) -> None:
    from devtools.embedded import free_port

    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                          "FAIL_MODE": "closed", "BUDGET_MS": 500}
    response = client.get("/ip")
    assert response.status_code == 503 and int(response["Retry-After"]) >= 1
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "open"}
    assert client.get("/ip").status_code == 200


# -- Django Ninja operations ---------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["/ninja/data", "/ninja/async-data", "/ninja/model", "/ninja/response"])
def test_an_operation_is_limited_whatever_it_returns(client: Any, url: str) -> None:
    responses = [client.get(url) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[0].json() in ({"ok": True}, {"name": "a"}, {"raw": True})
    assert responses[2].json()["error"] == "rate limit exceeded"
    assert responses[2]["Retry-After"]


def test_an_operation_answering_a_status_with_data(client: Any) -> None:
    statuses = [client.post("/ninja/status").status_code for _ in range(3)]
    assert statuses == [201, 201, 429]


@pytest.mark.parametrize("url", ["/ninja/slot", "/ninja/async-slot"])
def test_a_concurrency_slot_is_given_back_after_an_operation_returning_data(client: Any, url: str) -> None:
    assert [client.get(url).status_code for _ in range(3)] == [200, 200, 200]


@pytest.mark.parametrize("url", ["/ninja/slot", "/ninja/async-slot"])
def test_without_the_middleware_the_slot_is_given_back_when_the_operation_returns(
        client: Any, settings: Any, url: str) -> None:
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "RateLimitMiddleware" not in m]
    assert [client.get(url).status_code for _ in range(3)] == [200, 200, 200]


@ratelimit(rate="1/m", key="ip", group="recorded")
def recorded(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@ratelimit(rate="1/m", key="ip", group="arecorded")
async def arecorded(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@pytest.mark.parametrize("view", [recorded, arecorded])
def test_alone_the_decision_is_recorded_on_the_request_like_every_entry_points(settings: Any, view: Any) -> None:
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "RateLimitMiddleware" not in m]
    statuses = []
    for _ in range(2):
        request = RequestFactory().get("/recorded", REMOTE_ADDR="192.0.2.61")
        response = asyncio.run(view(request)) if asyncio.iscoroutinefunction(view) else view(request)
        outcome = outcome_of(request)
        assert outcome is not None and outcome.owns(f"decorator:{'arecorded' if view is arecorded else 'recorded'}")
        assert outcome.identity == "ip:192.0.2.61" and "RateLimit-Policy" in response
        statuses.append((response.status_code, outcome.status))
    assert statuses == [(200, ALLOWED), (429, DENIED)]


@pytest.mark.django_db
def test_block_false_under_the_middleware_flags_the_request_and_the_middlewares_decision_stands(client: Any) -> None:
    """With block=False the view's limit is decided apart from the middleware's call: the view runs, flagged,
    and the response carries the middleware's decision (the per-IP limit and the tier)."""
    key = make_key(make_tier("flagged", [("minute", "fixed_window", 10, 60, None, "")]))
    responses = [client.get("/api/flagged", headers={"X-API-Key": key}) for _ in range(3)]
    assert [(r.status_code, r.json()["limited"]) for r in responses] == [(200, False), (200, True), (200, True)]
    shown = [parse_ietf(r["RateLimit-Policy"]) for r in responses]
    assert [list(policies) for policies in shown] == [["ip", "minute"]] * 3
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["9", "8", "7"]
