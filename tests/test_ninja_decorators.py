"""`@ratelimit`, `@limit_concurrency` and `@limit_cost` on Django Ninja operations, sync and async: whatever
the operation returns (data, a model, a response, a status with data), an allowed request is answered
by Ninja and a refused one by the limiter, never with a 500. Against the real Redis."""

from __future__ import annotations

from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from ninja import NinjaAPI, Schema
from ninja.responses import Status

from ratelimit_app.decorators import limit_concurrency, ratelimit

pytestmark = pytest.mark.urls(__name__)

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
def response(request: HttpRequest) -> HttpResponse:
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


urlpatterns = [path("ninja/", api.urls)]


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
