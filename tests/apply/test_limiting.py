"""ratelimit_app.apply.limiting: `limit_request` (plan, then one call with the extra
checks), `decide` (report-only calls, what the outcome shows and counts), and `safely` (the
limiter's own failures follow the fail mode as read, logged once per cause), and RATELIMIT['ENABLED'] =
False at that one door of every entry point's decisions (nothing is sent to Redis), against the real
Redis and database."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient, Client, RequestFactory
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app import Policy
from ratelimit_app.apply import shedding
from ratelimit_app.apply.limitcheck import LimitCheck
from ratelimit_app.apply.limiting import (
    ALLOWED,
    DENIED,
    UNAUTHORIZED,
    UNAVAILABLE,
    LimitOutcome,
    limit_request,
    safely,
)
from ratelimit_app.decorators import limit_concurrency, limit_cost, ratelimit
from ratelimit_app.models import ClientRule, TierLimit
from ratelimit_app.service import events
from ratelimit_app.service.limiter import get_limiter
from ratelimit_app.throttling import ConcurrencyThrottle, ScopedRateThrottle, TierRateThrottle
from tests.support.limits_support import make_key, make_tier
from tests.support.tcp_proxy import TcpProxy, tcp_proxy

pytestmark = pytest.mark.django_db
factory = RequestFactory()
IP = "192.0.2.50"
TIGHT = Policy("tight", "fixed_window", limit=1, period=60)


class Collected:
    """A recorder keeping the limiter's reports."""

    def __init__(self) -> None:
        self.decisions: list[dict[str, Any]] = []
        self.shadow: list[dict[str, Any]] = []

    def record_decision(self, **kwargs: Any) -> None:
        self.decisions.append(kwargs)

    def record_shadow_blocked(self, **kwargs: Any) -> None:
        self.shadow.append(kwargs)

    def record_usage(self, **kwargs: Any) -> None: ...

    def observe_latency(self, seconds: float) -> None: ...

    def record_breaker_change(self, **kwargs: Any) -> None: ...


@pytest.fixture
def reports() -> Iterator[Collected]:
    installed = events._recorder
    collected = Collected()
    events.install(collected)
    yield collected
    events.install(installed)


def headers(key: str | None) -> dict[str, Any]:
    return {"HTTP_X_API_KEY": key} if key else {}


def request(key: str | None = None, path: str = "/api/things") -> Any:
    return factory.get(path, REMOTE_ADDR=IP, **headers(key))


def ip_remaining() -> int:
    return get_limiter().peek(f"ip:{IP}", (Policy.parse("100/m", name="ip", algorithm="sliding_window_counter"),),
                              ).remaining


def test_a_client_without_key_or_tier_is_charged_to_its_ip_and_refused(reports: Collected) -> None:
    outcome = limit_request(request())
    assert (outcome.status, outcome.message, outcome.identity) == (UNAUTHORIZED, "API key required", f"ip:{IP}")
    assert [p.name for p in outcome.policies] == ["ip"] and outcome.tier is None
    assert ip_remaining() == 99
    assert reports.decisions[-1]["unauthorized"] is True and reports.decisions[-1]["tier"] == "ip"


def test_extra_checks_are_decided_with_the_requests_limits_all_or_nothing() -> None:
    key = make_key(make_tier("extras", [("minute", "fixed_window", 10, 60, None, "")]))
    extra = [LimitCheck("throttle:tight", (TIGHT,), "mine")]
    first = limit_request(request(key), extra=extra)
    assert first.allowed and first.owns("mine") and [p.name for p in first.policies] == ["ip", "minute", "tight"]
    second = limit_request(request(key), extra=extra)
    assert second.status == DENIED and second.decision is not None and second.decision.policy == "tight"
    assert ip_remaining() == 99  # the refused request charged no limit
    assert len(second.checks) == len(second.decisions) == 3


def test_an_unusable_key_charges_the_ip_alone_never_the_extra_checks() -> None:
    extra = [LimitCheck("throttle:tight", (TIGHT,), "mine")]
    outcome = limit_request(request("not-a-key"), extra=extra)
    assert (outcome.status, outcome.message) == (UNAUTHORIZED, "malformed API key")
    assert not outcome.owns("mine") and get_limiter().peek("throttle:tight", (TIGHT,)).remaining == 1


def test_a_report_only_request_charges_the_per_ip_limit_alone_and_is_not_refused_by_the_tier(
        reports: Collected) -> None:
    key = make_key(make_tier("report", [("minute", "fixed_window", 1, 60, None, "")]))
    assert limit_request(request(key)).allowed
    assert limit_request(request(key)).status == DENIED
    counted = len(reports.decisions)
    report = limit_request(request(key), cost=0)
    assert report.status == ALLOWED and not report.charged
    assert report.decision is not None and not report.decision.allowed and report.decision.remaining == 0
    assert len(reports.decisions) == counted  # an allowed report is not counted
    assert ip_remaining() == 98  # the first request and the report: one unit each of the per-IP limit


def test_a_report_over_the_per_ip_limit_is_refused_and_counted(settings: Any, reports: Collected) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": "2/m"}
    key = make_key(make_tier("report", [("minute", "fixed_window", 100, 60, None, "")]))
    assert [limit_request(request(key), cost=0).status for _ in range(3)] == [ALLOWED, ALLOWED, DENIED]
    refused = limit_request(request(key), cost=0)
    assert refused.status == DENIED and refused.decision is not None and refused.decision.policy == "ip"
    assert [(d["allowed"], d["policy"]) for d in reports.decisions] == [(False, "ip")] * 2


def test_shadow_limits_are_not_shown_but_their_would_be_refusals_are_counted(reports: Collected) -> None:
    tier = make_tier("shadowed", [("minute", "fixed_window", 10, 60, None, "")])
    TierLimit.objects.create(tier=tier, name="dry", algorithm="fixed_window", limit=1, period=60, shadow=True)
    key = make_key(tier)
    outcomes = [limit_request(request(key)) for _ in range(2)]
    assert all(o.allowed for o in outcomes)
    assert [p.name for p in outcomes[0].policies] == ["ip", "minute"]
    assert [s["policies"] for s in reports.shadow] == [("dry",)]
    assert reports.shadow[0]["tier"] == "shadowed"


def test_an_allow_listed_client_is_decided_without_checks_and_counted_when_charged(reports: Collected) -> None:
    key = make_key(make_tier("listed", [("minute", "fixed_window", 1, 60, None, "")]))
    ClientRule.objects.create(action="allow", network="192.0.2.0/24")
    outcomes = [limit_request(request(key), extra=[LimitCheck("throttle:tight", (TIGHT,), "mine")])
                for _ in range(3)]
    assert all(o.allowed and o.checks == () and o.decision is None for o in outcomes)
    assert [d["listed"] for d in reports.decisions] == ["allow"] * 3
    limit_request(request(key), cost=0)
    assert len(reports.decisions) == 3  # a report is not counted
    assert ip_remaining() == 100 and get_limiter().peek("throttle:tight", (TIGHT,)).remaining == 1


def cause() -> str:
    """An error message no other test raises (each cause is logged with its traceback once per process)."""
    return f"broken setting {uuid.uuid4().hex}"


class Failing:
    """A limit that raises `error` (a bug, a setting changed at run time)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __call__(self) -> LimitOutcome:
        raise self.error


def test_a_failure_of_the_limiter_follows_the_fail_mode_and_is_logged_once_per_cause(
    settings: Any, caplog: pytest.LogCaptureFixture, reports: Collected
) -> None:
    caplog.set_level(logging.DEBUG, logger="ratelimit_app")
    failing = Failing(RuntimeError(cause()))
    first = safely(failing, where="the test", identity="key:abcd1234")
    assert first.status == ALLOWED and first.decision is not None and first.decision.degraded
    again = safely(failing, where="the test")
    assert again.allowed
    safely(Failing(ValueError(cause())), where="the test")
    levels = [(r.levelname, r.exc_info is not None) for r in caplog.records
              if getattr(r, "ratelimit_event", "") == "ratelimit.internal_error"]
    assert levels == [("ERROR", True), ("DEBUG", False), ("ERROR", True)]
    assert [(d["tier"], d["identity"], d["degraded"]) for d in reports.decisions] == \
        [("error", "key:abcd1234", True), ("error", "unknown", True), ("error", "unknown", True)]
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "closed"}
    refused = safely(failing, where="the test")
    assert refused.status == UNAVAILABLE and refused.decision is not None and not refused.decision.allowed


@pytest.mark.parametrize(("mode", "status"), [("closed", UNAVAILABLE), ("Closed", UNAVAILABLE), ("ajar", UNAVAILABLE),
                                            (" open", ALLOWED)])
def test_the_fail_mode_is_read_cautiously_even_when_other_settings_are_invalid(
        settings: Any, caplog: pytest.LogCaptureFixture, mode: str, status: str) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": mode, "IP_RATE": "lots"}
    caplog.set_level(logging.DEBUG, logger="ratelimit_app")
    from ratelimit_app.conf.settings import InvalidSetting

    assert safely(Failing(RuntimeError(cause())), where="the test").status == status  # "ajar": never the default
    assert safely(Failing(InvalidSetting("IP_RATE")), where="the test").status == status
    internal = [r for r in caplog.records if getattr(r, "ratelimit_event", "") == "ratelimit.internal_error"
                and "InvalidSetting" in r.getMessage()]
    assert [(r.levelname, r.exc_info) for r in internal] == [("DEBUG", None)]  # the settings' own line said it


# -- RATELIMIT["ENABLED"] = False ---------------------------------------------------------------------
@limit_cost(priority="low")
def low(request: HttpRequest) -> JsonResponse:
    return JsonResponse({})


@ratelimit(rate="1/h", key="ip")
def decorated(request: HttpRequest) -> JsonResponse:
    return JsonResponse({})


@ratelimit(rate="1/h", key="ip", count_if=lambda response: True)
def counted(request: HttpRequest) -> JsonResponse:
    return JsonResponse({})


@limit_concurrency(1, key="ip")
def single(request: HttpRequest) -> JsonResponse:
    return JsonResponse({})


@ratelimit(rate="1/h", key="ip")
async def decorated_async(request: HttpRequest) -> JsonResponse:
    return JsonResponse({})


class OneSlot(ConcurrencyThrottle):
    slots = 1
    scope = "one-slot"


class Throttled(APIView):
    throttle_classes = [TierRateThrottle, ScopedRateThrottle, OneSlot]
    throttle_scope = "items"

    def get(self, request: Request) -> Response:
        return Response({})


urlpatterns = [
    path("api/low", low), path("public/decorated", decorated), path("public/counted", counted),
    path("public/single", single), path("public/async", decorated_async), path("drf/throttled", Throttled.as_view()),
]
SYNC_PATHS = ["/api/low", "/public/decorated", "/public/counted", "/public/single", "/drf/throttled"]


@pytest.fixture
def proxy(settings: Any, redis_url: str) -> Iterator[TcpProxy]:
    """The limiter's Redis, and the Django cache its lookups share, behind a proxy that records every byte."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with tcp_proxy("127.0.0.1", port) as running:
        settings.ROOT_URLCONF = __name__
        settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": running.url}}
        settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": running.url, "SHED_CAPACITY": 1,
                              "SHED_LOW_AT": 0.5, "SHED_PROCESS_LIMIT": 1}
        yield running


def answers(client: Client) -> list[int]:
    """Two requests to each view, while another request of this process is in flight (so the process
    shedder's limit of 1 is reached for low-priority requests)."""
    shedding.in_flight.enter()
    try:
        sync = [client.get(url).status_code for url in SYNC_PATHS for _ in range(2)]
    finally:
        shedding.in_flight.leave()

    async def asynchronous() -> list[int]:
        async_client = AsyncClient()
        return [(await async_client.get(url)).status_code for url in ("/public/async", "/api/low") for _ in range(2)]

    return sync + asyncio.run(asynchronous())


def test_enabled_false_lets_every_request_through_and_sends_nothing_to_redis(settings: Any, proxy: TcpProxy) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "ENABLED": False}
    assert answers(Client()) == [200] * 14
    assert (proxy.connections, bytes(proxy.from_clients)) == (0, b"")
    # the same requests with the limits on: refused (401 without a key, 429, 503 shed), through Redis
    settings.RATELIMIT = {**settings.RATELIMIT, "ENABLED": True}
    limited = answers(Client())
    assert limited == [503, 503, 200, 429, 200, 429, 200, 200, 401, 401, 200, 429, 401, 401]
    assert proxy.connections > 0
