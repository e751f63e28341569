"""DRF throttles on the real Redis: TierRateThrottle, and the atomic drop-ins for DRF's own throttles."""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.test import Client
from django.urls import path
from rest_framework.authentication import SessionAuthentication
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from devtools.embedded import free_port
from ratelimit_app.core.policies import CONCURRENCY, Policy
from ratelimit_app.service import events
from ratelimit_app.service.limiter import get_limiter
from ratelimit_app.throttling import (
    AnonRateThrottle,
    ConcurrencyThrottle,
    RateLimitHeadersMixin,
    ScopedRateThrottle,
    TierRateThrottle,
    UserRateThrottle,
)
from ratelimit_app.throttling_checks import check_throttle_settings
from tests.support.limits_support import make_key, make_tier, parse_ietf

pytestmark = pytest.mark.urls(__name__)


class Ok(APIView):
    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class TierView(Ok):
    throttle_classes = [TierRateThrottle]


class ScopedTierView(Ok):
    throttle_classes = [TierRateThrottle]
    throttle_scope = "write"


class HeaderTierView(RateLimitHeadersMixin, Ok):
    throttle_classes = [TierRateThrottle]


class AnonView(Ok):
    throttle_classes = [AnonRateThrottle]


class UserView(Ok):
    authentication_classes = [SessionAuthentication]
    throttle_classes = [UserRateThrottle]


class ScopeA(Ok):
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "a"


class ScopeB(Ok):
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "b"


class NoScope(Ok):
    throttle_classes = [ScopedRateThrottle]


class ByEmailThrottle(AnonRateThrottle):
    scope = "by-email"

    def get_cache_key(self, request: Any, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": request.query_params.get("email", "")}


class ByEmail(Ok):
    throttle_classes = [ByEmailThrottle]


class UnknownScope(Ok):
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "nowhere"


urlpatterns = [
    path("t/tier", TierView.as_view()),
    path("t/tier/write", ScopedTierView.as_view()),
    path("t/tier/headers", HeaderTierView.as_view()),
    path("api/t/tier", TierView.as_view()),  # under the middleware's /api/ too
    path("t/anon", AnonView.as_view()),
    path("t/user", UserView.as_view()),
    path("t/a", ScopeA.as_view()),
    path("t/b", ScopeB.as_view()),
    path("t/none", NoScope.as_view()),
    path("t/unknown", UnknownScope.as_view()),
    path("t/by-email", ByEmail.as_view()),
]


def rates(settings: Any, **values: str) -> None:
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": values}


@pytest.fixture
def small_key(db: Any) -> str:
    tier = make_tier("small", [("burst", "token_bucket", 1, 3600, 3, ""),
                               ("write", "sliding_window", 1, 60, None, "write")])
    return make_key(tier)


def test_tier_throttle_enforces_the_tier_with_retry_after(client: Any, small_key: str) -> None:
    responses = [client.get("/t/tier", HTTP_X_API_KEY=small_key) for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    denied = responses[-1]
    assert "throttled" in denied.json()["detail"]
    assert 1 <= int(denied["Retry-After"]) <= 3600
    # RateLimitMiddleware (installed in the demo settings) adds the headers to the throttle's answers.
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["2", "1", "0", "0"]
    assert denied["X-RateLimit-Tier"] == "small" and parse_ietf(denied["RateLimit"])["burst"]["r"] == 0


@pytest.mark.django_db
def test_tier_throttle_refuses_bad_keys_with_401(client: Any) -> None:
    missing = client.get("/t/tier")
    assert missing.status_code == 401 and missing.json() == {"detail": "API key required"}
    malformed = client.get("/t/tier", HTTP_X_API_KEY="x" * 5000)
    assert malformed.status_code == 401 and malformed.json() == {"detail": "malformed API key"}
    assert "xxxxx" not in malformed.content.decode()


def test_tier_throttle_respects_throttle_scope(client: Any, small_key: str) -> None:
    assert client.get("/t/tier/write", HTTP_X_API_KEY=small_key).status_code == 200
    denied = client.get("/t/tier/write", HTTP_X_API_KEY=small_key)
    assert denied.status_code == 429 and denied["X-RateLimit-Remaining"] == "0"
    assert "write.write" in parse_ietf(denied["RateLimit-Policy"])
    assert client.get("/t/tier", HTTP_X_API_KEY=small_key).status_code == 200  # unscoped: base limits only


def test_headers_mixin_adds_headers_without_the_middleware(client: Any, settings: Any, small_key: str) -> None:
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "RateLimitMiddleware" not in m]
    assert "X-RateLimit-Limit" not in client.get("/t/tier", HTTP_X_API_KEY=small_key)
    response = client.get("/t/tier/headers", HTTP_X_API_KEY=small_key)
    assert response.status_code == 200 and response["X-RateLimit-Remaining"] == "1"  # the second of 3


def test_no_double_charge_when_the_middleware_already_limited(client: Any, small_key: str) -> None:
    first = client.get("/api/t/tier", HTTP_X_API_KEY=small_key)
    second = client.get("/api/t/tier", HTTP_X_API_KEY=small_key)
    assert (first["X-RateLimit-Remaining"], second["X-RateLimit-Remaining"]) == ("2", "1")


def test_anon_throttle_reads_rates_at_request_time(client: Any, settings: Any) -> None:
    rates(settings, anon="3/m")
    statuses = [client.get("/t/anon").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    rates(settings, anon="5/m")  # no re-import, no restart: the next request sees it
    assert [client.get("/t/anon").status_code for _ in range(3)] == [200, 200, 429]


def test_rates_with_a_multiplied_period(client: Any, settings: Any) -> None:
    rates(settings, anon="2/10m")
    assert [client.get("/t/anon").status_code for _ in range(2)] == [200, 200]
    denied = client.get("/t/anon")
    assert denied.status_code == 429
    assert 540 < int(denied["Retry-After"]) <= 600  # the window is ten minutes, not one


def test_anon_throttle_is_atomic_under_concurrency(settings: Any) -> None:
    rates(settings, anon="5/m")
    start = threading.Barrier(20)

    def one(_: int) -> int:
        client = Client()
        start.wait()
        return client.get("/t/anon").status_code

    with ThreadPoolExecutor(20) as pool:
        statuses = list(pool.map(one, range(20)))
    assert statuses.count(200) == 5 and statuses.count(429) == 15


@pytest.mark.django_db
def test_user_throttle_counts_each_user(client: Any, settings: Any, django_user_model: Any) -> None:
    rates(settings, user="2/m")
    alice = django_user_model.objects.create_user("alice", password="pw")
    bob = django_user_model.objects.create_user("bob", password="pw")
    client.force_login(alice)
    assert [client.get("/t/user").status_code for _ in range(3)] == [200, 200, 429]
    client.force_login(bob)
    assert client.get("/t/user").status_code == 200
    client.logout()
    assert [client.get("/t/user").status_code for _ in range(3)] == [200, 200, 429]  # anonymous: by IP


def test_scoped_throttle_counts_each_scope(client: Any, settings: Any) -> None:
    rates(settings, a="1/m", b="2/m")
    assert [client.get("/t/a").status_code for _ in range(2)] == [200, 429]
    assert [client.get("/t/b").status_code for _ in range(3)] == [200, 200, 429]
    assert all(client.get("/t/none").status_code == 200 for _ in range(5))  # no scope, no limit
    # A scope without a rate: `check` names the view (before the first request) ...
    errors = [m for m in check_throttle_settings() if m.id == "ratelimit.E011"]
    named = [e.msg.split(" has no rate")[0] for e in errors]
    assert named == ["tests.test_throttling.UnknownScope.throttle_scope = 'nowhere'"]
    # ... and a request that meets it anyway follows the fail mode instead of a 500
    assert client.get("/t/unknown").status_code == 200


def test_a_bad_rate_is_a_check_error_and_at_run_time_follows_the_fail_mode(client: Any, settings: Any) -> None:
    rates(settings, anon="ten per minute")
    errors = [m for m in check_throttle_settings() if m.id == "ratelimit.E010"]
    assert len(errors) == 1 and "DEFAULT_THROTTLE_RATES']['anon']" in errors[0].msg
    assert client.get("/t/anon").status_code == 200  # fail mode "open": the limiter degrades, the site works
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "closed"}
    assert client.get("/t/anon").status_code == 503


@pytest.mark.parametrize(("mode", "status"), [("open", 200), ("closed", 503)])
def test_throttles_follow_the_fail_mode_when_redis_is_down(client: Any, settings: Any, mode: str,
                                                          status: int) -> None:
    rates(settings, anon="5/m")
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                          "FAIL_MODE": mode, "BUDGET_MS": 500}
    response = client.get("/t/anon")
    assert response.status_code == status
    if status == 503:
        assert int(response["Retry-After"]) >= 1


class RefusedIdentities:
    """An events recorder keeping the identity label of each refused decision (what the dashboard and
    ratelimit_metrics list as top blocked)."""

    def __init__(self) -> None:
        self.identities: list[str] = []

    def record_decision(self, *, allowed: bool, identity: str, **kwargs: Any) -> None:
        if not allowed:
            self.identities.append(identity)

    def record_shadow_blocked(self, **kwargs: Any) -> None: ...

    def record_usage(self, **kwargs: Any) -> None: ...

    def observe_latency(self, seconds: float) -> None: ...

    def record_breaker_change(self, **kwargs: Any) -> None: ...


@pytest.mark.django_db
def test_operators_read_whom_a_drop_in_refused(client: Any, settings: Any, django_user_model: Any) -> None:
    rates(settings, user="1/m", anon="1/m", **{"by-email": "1/m"})
    alice = django_user_model.objects.create_user("alice", password="pw")
    refused = RefusedIdentities()
    installed = events._recorder
    events.install(refused)
    try:
        client.force_login(alice)
        assert [client.get("/t/user").status_code for _ in range(2)] == [200, 429]
        client.logout()
        assert [client.get("/t/anon").status_code for _ in range(2)] == [200, 429]
        assert [client.get("/t/by-email?email=bob@example.com").status_code for _ in range(2)] == [200, 429]
    finally:
        events.install(installed)
    user, address, custom = refused.identities
    assert (user, address) == (f"user:{alice.pk}", "ip:127.0.0.1")
    # a cache key of the project's own may hold anything: named by its scope, shown as a digest
    assert re.fullmatch(r"throttle\.by-email:#[0-9a-f]{12}", custom) and "bob" not in custom


class OneAtOnce(ConcurrencyThrottle):
    slots = 1
    scope = "one-at-once"


class Broken(RuntimeError):
    """What a view raises that DRF does not answer."""


class BrokenView(RateLimitHeadersMixin, Ok):
    throttle_classes = [OneAtOnce]

    def get(self, request: Any) -> Response:
        raise Broken("the view failed")


def test_the_headers_mixin_gives_back_the_slots_of_a_view_that_raises() -> None:
    factory = APIRequestFactory()
    for _ in range(2):  # without the slot given back, the second request would be refused
        with pytest.raises(Broken):
            BrokenView.as_view()(factory.get("/api/broken", REMOTE_ADDR="192.0.2.61"))
    slot = Policy("one-at-once", CONCURRENCY, limit=1, period=OneAtOnce.lease)
    assert get_limiter().peek("throttle:one-at-once:ip:192.0.2.61", (slot,)).remaining == 1
