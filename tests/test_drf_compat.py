"""The drop-ins behave as DRF's throttles do, with real time (DRF's own suite fakes its clock for these:
tests/drf_suite), and honour what DRF code written for DRF's throttles relies on."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import path
from rest_framework import throttling as drf_throttling
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from devtools.embedded import free_port
from ratelimit_app.decorators import limit_cost
from ratelimit_app.observability.queries import recent_metrics
from ratelimit_app.observability.recorder import flush
from ratelimit_app.throttling import (
    AnonRateThrottle,
    ScopedRateThrottle,
    TierRateThrottle,
    UserRateThrottle,
)
from ratelimit_app.throttling_checks import check_throttle_settings
from tests.support.limits_support import make_key, make_tier

pytestmark = pytest.mark.urls(__name__)
factory = APIRequestFactory()


class User3PerSecond(UserRateThrottle):
    rate = "3/sec"
    scope = "seconds"


class User6PerMinute(UserRateThrottle):
    rate = "6/min"
    scope = "minutes"


class Ok(APIView):
    def get(self, request: Any) -> Response:
        return Response("ok")


class PerSecondView(Ok):
    throttle_classes = (User3PerSecond,)


class StackedView(Ok):
    throttle_classes = (User3PerSecond, User6PerMinute)


class XYScoped(ScopedRateThrottle):
    THROTTLE_RATES = {"x": "3/s", "y": "1/s"}


class XView(Ok):
    throttle_classes = (XYScoped,)
    throttle_scope = "x"


class YView(Ok):
    throttle_classes = (XYScoped,)
    throttle_scope = "y"


class ByAccount(AnonRateThrottle):
    """Counts per `account` query parameter, like a get_cache_key override in a DRF project."""

    rate = "2/m"
    calls: list[str] = []

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        account = request.query_params.get("account")
        return None if account is None else f"account-{account}"

    def throttle_success(self) -> bool:
        type(self).calls.append("success")
        return super().throttle_success()

    def throttle_failure(self) -> bool:
        type(self).calls.append("failure")
        return super().throttle_failure()


class ByAccountView(Ok):
    throttle_classes = (ByAccount,)


class ByDevice(AnonRateThrottle):
    rate = "1/m"

    def get_ident(self, request: Any) -> str:
        return str(request.META.get("HTTP_X_DEVICE", "none"))


class ByDeviceView(Ok):
    throttle_classes = (ByDevice,)


class ColonScopeView(Ok):
    throttle_classes = (ScopedRateThrottle,)
    throttle_scope = "contacts:create"


class ColonScopeTwinView(Ok):
    throttle_classes = (ScopedRateThrottle,)
    throttle_scope = "contacts;create"  # sanitised alike, counted apart


class AnonView(Ok):
    throttle_classes = (AnonRateThrottle,)


class WithTimer(AnonRateThrottle):
    """DRF code that moves DRF's clock: ours never call it (check warns, W010)."""

    def timer(self) -> float:
        return 0.0


class TimerView(Ok):
    throttle_classes = (WithTimer,)


class StackedTierView(Ok):
    throttle_classes = (TierRateThrottle, ScopedRateThrottle)
    throttle_scope = "items"


@limit_cost(0)
class ReportOnlyTierView(Ok):
    throttle_classes = (TierRateThrottle,)


class PrivateView(StackedTierView):
    permission_classes = (IsAuthenticated,)


urlpatterns = [
    path("c/account", ByAccountView.as_view()),
    path("c/device", ByDeviceView.as_view()),
    path("c/colon", ColonScopeView.as_view()),
    path("c/colon-twin", ColonScopeTwinView.as_view()),
    path("c/anon", AnonView.as_view()),
    path("c/timer", TimerView.as_view()),
    path("api/c/stacked", StackedTierView.as_view()),
    path("api/c/report", ReportOnlyTierView.as_view()),
    path("api/c/private", PrivateView.as_view()),
]


def rates(settings: Any, **values: str) -> None:
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": values}


def dispatch(view: type[APIView], **extra: Any) -> Any:
    return view.as_view()(factory.get("/", **extra))


def wait_out(response: Any) -> None:
    """Wait for the time a 429 says (its Retry-After): the contract under test, not a hope."""
    time.sleep(int(response["Retry-After"]) + 0.05)


# -- DRF's fake-clock tests, with real time ---------------------------------------------------------

def test_a_refused_client_is_allowed_again_once_the_window_passed() -> None:
    statuses = [dispatch(PerSecondView) for _ in range(4)]
    assert [r.status_code for r in statuses] == [200, 200, 200, 429]
    assert statuses[-1]["Retry-After"] == "1"
    wait_out(statuses[-1])
    assert dispatch(PerSecondView).status_code == 200


def test_stacked_drop_ins_see_every_request_in_one_decision() -> None:
    first = [dispatch(StackedView) for _ in range(4)]
    assert [r.status_code for r in first] == [200, 200, 200, 429]
    assert first[-1]["Retry-After"] == "1"  # the per-second limit refused
    wait_out(first[-1])
    # DRF charges a refused request to the throttles that allowed it, so DRF allows 2 more here; ours
    # charge nothing for a refusal (all or nothing), so the minute limit has 3 left.
    second = [dispatch(StackedView) for _ in range(4)]
    assert [r.status_code for r in second] == [200, 200, 200, 429]
    assert 55 <= int(second[-1]["Retry-After"]) <= 60  # now the minute limit refuses


def test_a_rate_changed_on_the_class_applies_to_the_next_request() -> None:
    assert dispatch(PerSecondView).status_code == 200
    previous = User3PerSecond.rate
    try:
        User3PerSecond.rate = "1/sec"
        refused = dispatch(PerSecondView)
        assert refused.status_code == 429 and refused["Retry-After"] == "1"
    finally:
        User3PerSecond.rate = previous
    assert dispatch(PerSecondView).status_code == 200  # back at 3/sec: the second of three


def test_a_client_that_follows_the_rate_is_never_refused() -> None:
    responses = []
    for _ in range(7):
        responses.append(dispatch(PerSecondView))
        time.sleep(0.35)  # a little slower than 3 per second: never 3 in one second plus this one
    assert [r.status_code for r in responses] == [200] * 7
    assert all("Retry-After" not in r for r in responses)


def test_scopes_count_apart_and_reset_after_their_window() -> None:
    x = [dispatch(XView) for _ in range(4)]
    y = [dispatch(YView) for _ in range(2)]
    assert [r.status_code for r in x] == [200, 200, 200, 429]
    assert [r.status_code for r in y] == [200, 429]
    wait_out(x[-1])
    assert [dispatch(XView).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert dispatch(YView).status_code == 200


# -- what DRF code relies on ----------------------------------------------------------------------

def test_the_drop_ins_are_drf_classes() -> None:
    assert issubclass(AnonRateThrottle, drf_throttling.AnonRateThrottle)
    assert issubclass(UserRateThrottle, drf_throttling.UserRateThrottle)
    assert issubclass(ScopedRateThrottle, drf_throttling.ScopedRateThrottle)
    assert issubclass(ScopedRateThrottle, drf_throttling.SimpleRateThrottle)


def test_get_cache_key_override_names_what_is_limited_and_the_hooks_are_called(client: Any) -> None:
    ByAccount.calls = []
    assert [client.get("/c/account?account=1").status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/c/account?account=2").status_code == 200
    assert all(client.get("/c/account").status_code == 200 for _ in range(4))  # None: not throttled
    assert ByAccount.calls == ["success", "success", "failure", "success"]


def test_get_ident_override_is_what_is_limited(client: Any) -> None:
    assert [client.get("/c/device", HTTP_X_DEVICE="a").status_code for _ in range(2)] == [200, 429]
    assert client.get("/c/device", HTTP_X_DEVICE="b").status_code == 200


@pytest.mark.parametrize(("rate", "allowed"), [("2/hr", 2), ("2/mins", 2), ("2/secs", 2), ("2/10m", 2)])
def test_every_rate_drf_accepts_is_enforced(client: Any, settings: Any, rate: str, allowed: int) -> None:
    rates(settings, anon=rate)
    statuses = [client.get("/c/anon").status_code for _ in range(allowed + 1)]
    assert statuses == [200] * allowed + [429]


def test_a_zero_rate_refuses_every_request_without_redis(client: Any, settings: Any) -> None:
    rates(settings, anon="0/day")
    # No Redis answers here and the fail mode would let a request through: a 429 can only come from
    # the zero rate itself, decided without Redis.
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                          "FAIL_MODE": "open", "BUDGET_MS": 200}
    responses = [client.get("/c/anon") for _ in range(3)]
    assert [r.status_code for r in responses] == [429] * 3
    assert all("Retry-After" not in r for r in responses)  # never: there is nothing to wait for
    rates(settings, anon="5/day")
    assert client.get("/c/anon").status_code == 200  # the same setup with a rate: Redis is down, fail open


def test_any_scope_string_drf_accepts_is_a_safe_policy(client: Any, settings: Any) -> None:
    rates(settings, **{"contacts:create": "1/m", "contacts;create": "1/m"})
    assert [client.get("/c/colon").status_code for _ in range(2)] == [200, 429]
    assert client.get("/c/colon-twin").status_code == 200  # a different scope, a different counter


def test_num_proxies_is_honoured_and_none_ignores_x_forwarded_for(client: Any, settings: Any) -> None:
    rates(settings, anon="1/m")
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": None}
    # NUM_PROXIES None (DRF's default): X-Forwarded-For is ignored, so it cannot split one client
    assert client.get("/c/anon", HTTP_X_FORWARDED_FOR="198.51.100.1").status_code == 200
    assert client.get("/c/anon", HTTP_X_FORWARDED_FOR="198.51.100.2").status_code == 429
    # NUM_PROXIES 1: the address the proxy saw tells clients apart behind it
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    assert client.get("/c/anon", HTTP_X_FORWARDED_FOR="198.51.100.3").status_code == 200
    assert client.get("/c/anon", HTTP_X_FORWARDED_FOR="198.51.100.4").status_code == 200
    assert client.get("/c/anon", HTTP_X_FORWARDED_FOR="198.51.100.4").status_code == 429


def test_check_warns_when_x_forwarded_for_is_ignored(settings: Any) -> None:
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": None}
    settings.RATELIMIT = {**settings.RATELIMIT, "TRUSTED_PROXIES": 0}
    assert "ratelimit.W011" in [m.id for m in check_throttle_settings()]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 0}
    assert "ratelimit.W011" not in [m.id for m in check_throttle_settings()]


def test_unsupported_overrides_fail_loudly() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"test_drf_compat\..*WithCache\.cache"):
        class WithCache(AnonRateThrottle):
            cache = object()  # type: ignore[assignment]

    warnings = [m.msg for m in check_throttle_settings() if m.id == "ratelimit.W010"]
    assert len(warnings) == 1 and warnings[0].startswith(f"{__name__}.WithTimer overrides timer,")


# -- stacked throttles: one decision, all or nothing -------------------------------------------------

@pytest.mark.django_db
def test_stacked_tier_and_scoped_throttles_charge_a_refused_request_nothing(client: Any, settings: Any) -> None:
    rates(settings, items="30/m")
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": "100/m", "IP_ALGORITHM": "sliding_window"}
    tier = make_tier("stack", [("burst", "fixed_window", 50, 3600, None, ""),
                               ("minute", "sliding_window", 200, 60, None, "")])
    key = make_key(tier)
    flush()
    before = recent_metrics(hours=2)
    responses = [client.get("/api/c/stacked", HTTP_X_API_KEY=key) for _ in range(40)]
    assert [r.status_code for r in responses].count(200) == 30
    assert [r.status_code for r in responses[30:]] == [429] * 10
    refused = responses[-1]
    # The headers describe the limit that refused (the scope's 30/m), not one that still allowed.
    assert refused["X-RateLimit-Limit"] == "30" and refused["X-RateLimit-Remaining"] == "0"
    last_allowed = responses[29]
    assert last_allowed["X-RateLimit-Remaining"] == "0"  # the tightest: items 30 -> 0
    remaining = {r.policy: r.remaining for r in refused.wsgi_request.ratelimit.outcome.decision.results}
    assert remaining == {"ip": 70, "burst": 20, "minute": 170, "items": 0}  # charged 30 times, not 40
    assert flush() is True
    after = recent_metrics(hours=2)
    assert (after.allowed - before.allowed, after.blocked - before.blocked) == (30, 10)  # once each


@pytest.mark.django_db
def test_a_report_only_route_is_never_charged_by_the_tier_throttle(client: Any) -> None:
    tier = make_tier("report", [("minute", "sliding_window", 2, 60, None, "")])
    key = make_key(tier)
    responses = [client.get("/api/c/report", HTTP_X_API_KEY=key) for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["2"] * 5


@pytest.mark.django_db
def test_drf_refusing_before_the_throttles_still_charges_the_request_once(client: Any) -> None:
    """A DRF view whose permission check refuses never reaches its throttles: the middleware charges
    the request on the way out, once."""
    tier = make_tier("perm", [("minute", "sliding_window", 5, 60, None, "")])
    key = make_key(tier)
    responses = [client.get("/api/c/private", HTTP_X_API_KEY=key) for _ in range(2)]
    assert [r.status_code for r in responses] == [403, 403]
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["4", "3"]
