"""ratelimit_app.apply.routes: what a route declares (`RouteLimit` and `cost_for`), how the middleware finds
it on a resolved view (`route_for_view`, `view_limit_of`, `resolve_view`), and the checks of
scopes and costs."""

from __future__ import annotations

from typing import Any, TypeVar, cast

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from django.views import View
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.apply.routes import (
    DEFAULT_ROUTE,
    RouteLimit,
    route_for_view,
    route_of,
    validate_cost,
    validate_scope,
    view_limit_of,
    view_name,
)
from ratelimit_app.decorators import limit_cost, ratelimit


def plain(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


class Page(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")


class Api(APIView):
    def get(self, request: Any) -> Response:
        return Response("ok")


ViewT = TypeVar("ViewT", bound=View)


def derived(base: type[ViewT], **attributes: Any) -> type[ViewT]:
    """A subclass of `base` with these class attributes."""
    return cast(type[ViewT], type(f"{base.__name__}Derived", (base,), attributes))


def test_a_cost_for_some_methods_leaves_the_others_at_one() -> None:
    route = RouteLimit(5, methods=frozenset({"POST", "PUT"}))
    assert [route.cost_for(m) for m in ("POST", "put", "GET", "", None)] == [5, 5, 1, 1, 1]
    assert [RouteLimit(5).cost_for(m) for m in ("POST", "GET", None)] == [5, 5, 5]
    assert RouteLimit(0).cost_for("GET") == 0  # report only
    assert (DEFAULT_ROUTE.cost, DEFAULT_ROUTE.scope, DEFAULT_ROUTE.priority) == (1, "", None)


@pytest.mark.parametrize("scope", ["a", "search", "export-v2", "A_b-9", "x" * 30])
def test_valid_scopes(scope: str) -> None:
    assert validate_scope(scope) == scope


@pytest.mark.parametrize("scope", ["", "x" * 31, "has space", "dots.not.allowed", "colon:scope", "é", None, 5])
def test_invalid_scopes_are_refused_naming_the_rule(scope: Any) -> None:
    with pytest.raises(ValueError, match="must be 1-30 letters, digits, '_' or '-'"):
        validate_scope(scope)


def test_costs_are_integers_from_the_minimum_to_a_billion() -> None:
    assert [validate_cost(c) for c in (0, 1, 10**9)] == [0, 1, 10**9]
    assert validate_cost(1, minimum=1) == 1
    for bad, minimum in ((-1, 0), (0, 1), (10**9 + 1, 0), (True, 0), (1.0, 0), ("3", 0), (None, 0)):
        with pytest.raises(ValueError, match=f"cost: .* must be an integer from {minimum} to 1000000000"):
            validate_cost(bad, minimum=minimum)


def test_view_name_names_functions_classes_and_other_callables() -> None:
    assert view_name(plain) == f"{__name__}.plain"
    assert view_name(Page) == f"{__name__}.Page"

    class Callable:
        def __call__(self, request: HttpRequest) -> HttpResponse:
            return HttpResponse("ok")

    assert view_name(Callable()).endswith(".Callable")


def test_a_view_without_declarations_gets_the_default_route() -> None:
    assert route_for_view(plain) is DEFAULT_ROUTE
    assert route_for_view(Page.as_view()) is DEFAULT_ROUTE
    assert route_for_view(Api.as_view()) is DEFAULT_ROUTE
    assert route_for_view(object()) is DEFAULT_ROUTE


def test_a_declaration_is_found_on_the_function_or_on_the_class_behind_as_view() -> None:
    assert route_for_view(limit_cost(3)(plain)) == RouteLimit(3)
    page = limit_cost(2, scope="pages")(derived(Page))
    assert route_for_view(page.as_view()) == RouteLimit(2, "pages")
    api = limit_cost(0, priority="critical")(derived(Api))
    assert route_for_view(api.as_view()) == RouteLimit(0, priority="critical")


def test_a_drf_views_throttle_scope_is_its_scope_when_nothing_is_declared() -> None:
    scoped = derived(Api, throttle_scope="uploads")
    assert route_for_view(scoped.as_view()) == RouteLimit(1, "uploads")
    declared = limit_cost(4, scope="declared")(derived(Api, throttle_scope="uploads"))
    assert route_for_view(declared.as_view()) == RouteLimit(4, "declared")  # a declaration wins
    for odd in ("", None, 42):
        assert route_for_view(derived(Api, throttle_scope=odd).as_view()) is DEFAULT_ROUTE


def test_view_limit_of_finds_what_ratelimit_leaves_on_a_view() -> None:
    assert view_limit_of(plain) is None
    limited = ratelimit("10/m")(plain)
    limit = view_limit_of(limited)
    assert limit is not None and limit.joins_request_limits and limit.cost == 1
    unblocked = view_limit_of(ratelimit("10/m", block=False)(plain))
    assert unblocked is not None and not unblocked.joins_request_limits  # its view runs anyway: decided alone


def test_route_of_reads_a_views_declarations_once_per_method_until_settings_change(settings: Any) -> None:
    @limit_cost(5, methods=["POST"], scope="upload")
    def upload(request: HttpRequest) -> HttpResponse:
        return HttpResponse("ok")

    factory = RequestFactory()
    posted = route_of(upload, factory.post("/api/upload"))
    assert (posted.cost, posted.route.scope, posted.deferred, posted.view_limit) == (5, "upload", False, None)
    assert route_of(upload, factory.post("/api/upload")) is posted  # remembered
    assert route_of(upload, factory.get("/api/upload")).cost == 1  # per method
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": "7/m"}
    assert route_of(upload, factory.post("/api/upload")) is not posted  # read again after a change
