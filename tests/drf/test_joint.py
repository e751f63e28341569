"""ratelimit_app.drf.joint: `JointThrottle` (every throttle of ours on a view decided in one call, each
answering for its own limits, DRF's hooks called as DRF calls them) and `wait`, with views dispatched
directly (no middleware) against the real Redis and database."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import redis
from django.test import Client
from django.urls import path
from django.views import View
from rest_framework import throttling as drf_throttling
from rest_framework.decorators import api_view, throttle_classes
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from devtools.embedded import RedisProcess
from ratelimit_app import Decision, Policy, PolicyResult
from ratelimit_app.apply.limitcheck import LimitCheck
from ratelimit_app.apply.routes import ResolvedView, resolve_view
from ratelimit_app.decorators import limit_cost, usage
from ratelimit_app.drf.joint import JointThrottle, django_request_of
from ratelimit_app.models import TierLimit
from ratelimit_app.service import events
from ratelimit_app.service.limiter import get_limiter
from ratelimit_app.throttling import (
    AnonRateThrottle,
    ConcurrencyThrottle,
    RateLimitHeadersMixin,
    ScopedRateThrottle,
    TierRateThrottle,
)
from tests.support.limits_support import make_key, make_tier
from tests.support.topology import command_calls

factory = APIRequestFactory()


class Counted(JointThrottle):
    """A throttle of `limit` requests a minute on one identity; it records DRF's hooks."""

    limit: ClassVar[int] = 2
    identity: ClassVar[str] = "account:1"
    hooks: ClassVar[list[str]]

    def limit_checks(self, request: Request, view: Any) -> list[LimitCheck] | None:
        if self.limit == 0:
            return None  # a rate of 0: refuse outright
        if self.limit < 0:
            return []  # does not limit this request
        policy = Policy(type(self).__name__.lower(), "fixed_window", limit=self.limit, period=60)
        return [LimitCheck(f"{self.identity}:{type(self).__name__}", (policy,), self.owner)]

    def throttle_success(self) -> bool:
        type(self).hooks.append("success")
        return super().throttle_success()

    def throttle_failure(self) -> bool:
        type(self).hooks.append("failure")
        return super().throttle_failure()


class Roomy(Counted):
    limit = 10
    hooks = []


class Tight(Counted):
    limit = 1
    hooks = []


class Zero(Counted):
    limit = 0
    hooks = []


class Silent(Counted):
    limit = -1
    hooks = []


def view_of(*throttles: type[JointThrottle], cost: int | None = None) -> Any:
    class Ok(APIView):
        throttle_classes = throttles

        def get(self, request: Any) -> Response:
            return Response("ok")

    return (limit_cost(cost)(Ok) if cost is not None else Ok).as_view()


def get(view: Any, **headers: Any) -> Any:
    return view(factory.get("/api/things", REMOTE_ADDR="192.0.2.10", **headers))


@pytest.fixture(autouse=True)
def _clear_hooks() -> None:
    for throttle in (Roomy, Tight, Zero, Silent):
        throttle.hooks = []


@pytest.fixture
def private(settings: Any, server: RedisProcess) -> Iterator[redis.Redis]:
    """The limiter on a redis-server of the test's own, and a client of it to count commands."""
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url}
    client = redis.Redis(port=server.port)
    yield client
    client.close()


def test_every_throttle_on_a_view_is_decided_in_one_call(private: redis.Redis) -> None:
    view = view_of(Roomy, Tight)
    assert get(view).status_code == 200  # loads the script and connects
    before = command_calls(private, "evalsha")
    assert get(view).status_code == 429
    assert command_calls(private, "evalsha") - before == 1


def test_only_the_throttle_whose_limit_refused_reports_a_failure_and_nothing_is_charged() -> None:
    view = view_of(Roomy, Tight)
    assert get(view).status_code == 200
    refused = get(view)
    assert refused.status_code == 429
    assert Tight.hooks == ["success", "failure"]
    assert Roomy.hooks == ["success", "success"]  # its own limit allowed: DRF calls its success hook
    roomy = Policy("roomy", "fixed_window", limit=10, period=60)
    assert get_limiter().peek("account:1:Roomy", (roomy,)).remaining == 9  # the refusal charged it nothing


def test_a_rate_of_zero_refuses_without_asking_redis_or_charging_the_others(private: redis.Redis) -> None:
    view = view_of(Roomy, Zero)
    before = command_calls(private, "evalsha")
    assert [get(view).status_code for _ in range(3)] == [429] * 3
    assert command_calls(private, "evalsha") == before
    assert Zero.hooks == ["failure"] * 3 and Roomy.hooks == []  # Roomy was never decided


def test_a_throttle_that_does_not_limit_the_request_calls_no_hook() -> None:
    view = view_of(Silent, Tight)
    assert [get(view).status_code for _ in range(2)] == [200, 429]
    assert Silent.hooks == []


def test_wait_is_the_refusing_limits_retry_rounded_up_to_a_second_and_none_otherwise() -> None:
    throttle = Tight()
    assert throttle.wait() is None  # nothing decided yet
    result = PolicyResult("tight", False, 1, 0, 0.2, 0.2)
    throttle.decision = Decision.from_results((result,))
    assert throttle.wait() == 1.0
    throttle.decision = Decision.from_results((PolicyResult("tight", False, 1, 0, 41.5, 41.5),))
    assert throttle.wait() == 41.5
    throttle.decision = Decision.from_results((PolicyResult("tight", False, 1, 0, 0.0, math.inf),))
    assert throttle.wait() is None  # never allowed: no time to wait for
    throttle.decision = Decision.from_results((PolicyResult("tight", True, 1, 0, 5.0, None),))
    assert throttle.wait() is None


def test_the_metrics_name_the_identity_of_a_throttle_of_the_projects_by_a_digest_never_as_it_is() -> None:
    seen: list[dict[str, Any]] = []

    class Recorder:
        def record_decision(self, **kwargs: Any) -> None:
            seen.append(kwargs)

        def record_shadow_blocked(self, **kwargs: Any) -> None: ...

        def record_usage(self, **kwargs: Any) -> None: ...

        def observe_latency(self, seconds: float) -> None: ...

        def record_breaker_change(self, **kwargs: Any) -> None: ...

    installed = events._recorder
    events.install(Recorder())
    try:
        get(view_of(Tight))
    finally:
        events.install(installed)
    [decision] = seen
    assert decision["identity"].startswith("throttle:#") and "account" not in decision["identity"]
    assert decision["tier"] == "throttle"


def test_a_throttle_without_limit_checks_is_a_logged_error_and_the_request_follows_the_fail_mode(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    view = view_of(JointThrottle)
    assert get(view).status_code == 200  # "open", the default: the site keeps working
    assert ".limit_checks() must be overridden" in caplog.text
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "closed"}
    assert get(view).status_code == 503


def test_django_request_of_unwraps_a_drf_request() -> None:
    django_request = factory.get("/api/things")
    assert django_request_of(Request(django_request)) is django_request
    assert django_request_of(django_request) is django_request


@pytest.mark.parametrize(("throttles", "defers"), [
    ((TierRateThrottle,), True), ((ScopedRateThrottle,), True), ((drf_throttling.AnonRateThrottle,), False),
    ((drf_throttling.UserRateThrottle, ConcurrencyThrottle), True), ((Counted,), True), ((), False),
])
def test_a_drf_view_is_deferred_to_its_throttles_when_one_of_ours_is_among_them(throttles: tuple[type, ...],
                                                                               defers: bool) -> None:
    view = view_of(*throttles)
    request = factory.get("/api/things")
    assert resolve_view(view, request) == ResolvedView(view, defers)


def test_other_views_are_not_deferred() -> None:
    def plain(request: Any) -> None: ...

    request = factory.get("/api/things")
    assert resolve_view(plain, request) == ResolvedView(plain, False)
    page = View.as_view()
    assert resolve_view(page, request) == ResolvedView(page, False)


class Anon(AnonRateThrottle):
    THROTTLE_RATES = {"anon": "50/m"}


class Scoped(ScopedRateThrottle):
    THROTTLE_RATES = {"things": "50/m"}


class Slots(ConcurrencyThrottle):
    slots = 5
    scope = "drf-joint-slots"


class Everything(APIView):
    throttle_classes = [TierRateThrottle, Anon, Scoped, Slots]
    throttle_scope = "things"

    def get(self, request: Any) -> Response:
        return Response("ok")


urlpatterns = [path("api/everything", Everything.as_view())]  # (chat_function added below)


@pytest.mark.django_db
@pytest.mark.urls(__name__)
def test_under_the_middleware_the_tier_and_every_throttle_cost_one_call_per_request(private: redis.Redis) -> None:
    key = make_key(make_tier("drfjoint", [("minute", "fixed_window", 50, 60, None, "")]))
    client = Client()
    assert client.get("/api/everything", HTTP_X_API_KEY=key).status_code == 200  # loads the script, connects
    before = command_calls(private, "evalsha")
    responses = [client.get("/api/everything", HTTP_X_API_KEY=key) for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert command_calls(private, "evalsha") - before == 3  # one per request: per-IP, tier, 3 throttles
    assert responses[-1]["X-RateLimit-Tier"] == "drfjoint"


def _tokens_tier(slug: str) -> str:
    """A key of a tier of 100 requests and 1,000 tokens a minute (an exact sliding window)."""
    tier = make_tier(slug, [("minute", "fixed_window", 100, 60, None, "")])
    TierLimit.objects.create(tier=tier, name="tokens", algorithm="sliding_window", limit=1000, period=60,
                             unit="tokens")
    return make_key(tier)


@usage(tokens=lambda request: int(request.data["max_tokens"]))  # type: ignore[attr-defined]  # a DRF Request
class Chat(RateLimitHeadersMixin, APIView):
    throttle_classes = [TierRateThrottle]

    def post(self, request: Any) -> Response:
        request.ratelimit.report_usage("tokens", 100)
        return Response("answered")


@usage(tokens=lambda request: int(request.data["max_tokens"]))  # type: ignore[attr-defined]  # a DRF Request
@api_view(["POST"])
@throttle_classes([TierRateThrottle])
def chat_function(request: Any) -> Response:
    request.ratelimit.report_usage("tokens", 100)
    return Response("answered")


def _through_the_mixin(key: str) -> Any:
    request = factory.post("/api/chat", {"max_tokens": 500}, format="json", HTTP_X_API_KEY=key)
    response = Chat.as_view()(request)
    response.render()
    response.close()  # the end of the response: its reservation settled at what it used
    return response


def _through_the_middleware(key: str) -> Any:
    return Client().post("/api/chat", {"max_tokens": 500}, content_type="application/json", HTTP_X_API_KEY=key)


@pytest.mark.django_db
@pytest.mark.urls(__name__)
@pytest.mark.parametrize("send", [_through_the_mixin, _through_the_middleware], ids=["APIView", "api_view"])
def test_a_drf_view_reserves_its_estimate_in_the_throttles_call_and_settles_what_it_used(
    send: Any, private: redis.Redis
) -> None:
    key = _tokens_tier("drftokens")
    statuses = [send(key).status_code for _ in range(10)]
    # as under the middleware alone: 6 admitted (5 x 100 used and 500 reserved fit in 1,000; a 7th would
    # need 500 more than the 400 left), every reservation settled exactly at the 100 used
    assert statuses == [200] * 6 + [429] * 4
    before = command_calls(private, "evalsha")
    assert send(key).status_code == 429
    assert command_calls(private, "evalsha") - before == 1  # the throttles' one call decided it


@pytest.mark.django_db
def test_an_estimate_the_request_cannot_give_is_a_400() -> None:
    key = _tokens_tier("drfbad")
    response = Chat.as_view()(factory.post("/api/chat", {"max": 1}, format="json", HTTP_X_API_KEY=key))
    assert response.status_code == 400 and "tokens" in response.data["detail"]


urlpatterns.append(path("api/chat", chat_function))
