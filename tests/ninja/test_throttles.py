"""Our Django Ninja throttles on the real Redis, against the behaviour of Ninja's throttling that its
documentation describes: the rates and periods it accepts, scopes and NINJA_DEFAULT_THROTTLE_RATES,
client addresses (NINJA_NUM_PROXIES), `wait()`, authenticated and anonymous clients, several throttles
on one operation, API, router and operation levels; sync and `async def` operations."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import ninja.throttling as ninja_throttling
import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.http import HttpRequest
from django.test import AsyncClient, RequestFactory
from django.urls import path
from ninja import NinjaAPI, Router
from ninja.security import APIKeyHeader, django_auth

from ratelimit_app.decorators import usage
from ratelimit_app.models import TierLimit
from ratelimit_app.ninja import AnonRateThrottle, AuthRateThrottle, TierRateThrottle, UserRateThrottle
from ratelimit_app.ninja.throttles import _in_sync_code
from ratelimit_app.plans.lookups import require_io
from ratelimit_app.service.limiter_async import get_async_limiter

from ..support.limits_support import make_key, make_tier, parse_ietf, record_planning_threads

pytestmark = pytest.mark.urls(__name__)
T = TypeVar("T")


class Token(APIKeyHeader):
    param_name = "X-Token"

    def authenticate(self, request: HttpRequest, key: str | None) -> str | None:
        return key if key in ("alice-token", "bob-token") else None


class Burst(AnonRateThrottle):
    scope = "burst"


api = NinjaAPI(urls_namespace="ninja-throttles")
router = Router(throttle=AnonRateThrottle("2/m"))
tiered = NinjaAPI(urls_namespace="ninja-tiered", throttle=TierRateThrottle())
ANON = AnonRateThrottle("3/m")
SHARED = AnonRateThrottle("5/m")


@api.get("/anon", throttle=ANON)
def anon(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/async-anon", throttle=AnonRateThrottle("3/m"))
async def async_anon(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/ten-minutes", throttle=AnonRateThrottle("2/10m"))
def ten_minutes(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/auth", auth=Token(), throttle=[AnonRateThrottle("1/m"), AuthRateThrottle("2/m")])
def by_auth(request: HttpRequest) -> dict[str, str]:
    return {"auth": str(request.auth)}  # type: ignore[attr-defined]


@api.get("/optional-auth", auth=[Token(), lambda request: "anonymous"], throttle=AnonRateThrottle("1/m"))
def optional_auth(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/user", throttle=UserRateThrottle("2/m"))
def by_user(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/stacked", throttle=[SHARED, Burst("2/m")])
def stacked(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/two-rates", throttle=[AnonRateThrottle("1/m"), AnonRateThrottle("3/m")])
def two_rates(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/three", throttle=AnonRateThrottle("3/m"))
def three(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@api.get("/shared", throttle=AnonRateThrottle("5/m"))
def shared(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@router.get("/routed")
def routed(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@router.get("/overruled", throttle=AnonRateThrottle("4/m"))
def overruled(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


api.add_router("/router", router)


@tiered.get("/data")
def tier_data(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@tiered.get("/async-data")
async def async_tier_data(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@tiered.get("/session", auth=django_auth)
def session_data(request: HttpRequest) -> dict[str, bool]:
    return {"ok": True}


@tiered.post("/chat")
@usage(tokens=lambda request: int(json.loads(request.body)["max_tokens"]))
def chat(request: HttpRequest) -> dict[str, bool]:
    request.ratelimit.report_usage("tokens", 100)  # type: ignore[attr-defined]
    return {"ok": True}


@tiered.post("/async-chat")
@usage(tokens=lambda request: int(json.loads(request.body)["max_tokens"]))
async def async_chat(request: HttpRequest) -> dict[str, bool]:
    request.ratelimit.report_usage("tokens", 100)  # type: ignore[attr-defined]
    return {"ok": True}


urlpatterns = [path("ninja/", api.urls), path("tiered/", tiered.urls)]


@pytest.mark.parametrize(("rate", "parsed"), [
    ("10/s", (10, 1)), ("10/sec", (10, 1)), ("10/m", (10, 60)), ("10/min", (10, 60)), ("10/h", (10, 3600)),
    ("10/hour", (10, 3600)), ("10/d", (10, 86400)), ("10/day", (10, 86400)), ("100/5m", (100, 300)),
    ("100/300s", (100, 300)), ("100/300", (100, 300)), ("0/m", (0, 60)),
])
def test_the_rates_ninja_accepts_mean_the_same(rate: str, parsed: tuple[int, int]) -> None:
    ours = AnonRateThrottle(rate)
    assert (ours.num_requests, ours.duration) == parsed == ninja_throttling.AnonRateThrottle(rate).parse_rate(rate)


@pytest.mark.parametrize("rate", ["ten/m", "10/fortnight", "10"])
def test_a_bad_rate_fails_where_ninja_fails(rate: str) -> None:
    with pytest.raises(ValueError, match="Invalid rate format"):
        AnonRateThrottle(rate)


def test_a_rate_admits_exactly_its_requests_then_answers_like_ninja(client: Any) -> None:
    responses = [client.get("/ninja/anon") for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    denied = responses[-1]
    assert denied.json() == {"detail": "Too many requests."}  # Ninja's own answer to Throttled
    assert 1 <= int(denied["Retry-After"]) <= 60
    # RateLimitMiddleware (installed in the demo settings) adds the rate limit headers
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["2", "1", "0", "0"]
    assert parse_ietf(denied["RateLimit-Policy"]) == {"anon": {"q": 3, "w": 60}}


def test_the_period_is_the_rates_whole_period(client: Any) -> None:
    assert [client.get("/ninja/ten-minutes").status_code for _ in range(2)] == [200, 200]
    denied = client.get("/ninja/ten-minutes")
    assert denied.status_code == 429 and 540 < int(denied["Retry-After"]) <= 600


def test_an_async_operation_is_limited_alike(client: Any) -> None:
    assert [client.get("/ninja/async-anon").status_code for _ in range(4)] == [200, 200, 200, 429]


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run `scenario()` in a new event loop (Django's ASGI handler through AsyncClient), then close the
    Redis client made for that loop and the database connections of sync_to_async's thread."""
    async def main() -> T:
        try:
            return await scenario()
        finally:
            await get_async_limiter().aclose()
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


def test_an_async_operation_under_asgi_is_decided_on_the_event_loop() -> None:
    async def scenario() -> list[int]:
        client = AsyncClient()
        return [(await client.get("/ninja/async-anon")).status_code for _ in range(4)]

    assert run(scenario) == [200, 200, 200, 429]


def test_wait_is_the_time_until_the_limit_allows_again(settings: Any) -> None:
    throttle = AnonRateThrottle("2/m")
    factory = RequestFactory()
    answers = [throttle.allow_request(factory.get("/")) for _ in range(3)]
    assert answers == [True, True, False]
    wait = throttle.wait()
    assert wait is not None and 59 < wait <= 60  # the first of the two requests leaves the window in ~60 s


def test_scope_rates_come_from_ninja_settings(settings: Any) -> None:
    settings.NINJA_DEFAULT_THROTTLE_RATES = {"anon": "7/h", "burst": None}
    assert AnonRateThrottle().rate == "7/h" and (AnonRateThrottle().num_requests, AnonRateThrottle().duration) == (
        7, 3600)
    unlimited = Burst()  # a scope whose rate is None limits nothing
    assert all(unlimited.allow_request(RequestFactory().get("/")) for _ in range(5))
    with pytest.raises(ImproperlyConfigured, match="No default throttle rate set for 'user' scope"):
        UserRateThrottle()

    class NoScope(AnonRateThrottle):
        scope = None  # type: ignore[assignment]

    with pytest.raises(ImproperlyConfigured, match="must set either `.scope` or `.rate`"):
        NoScope()

    class Own(AnonRateThrottle):
        THROTTLE_RATES = {"anon": "1/s"}

    assert Own().rate == "1/s"


@pytest.mark.parametrize(("num_proxies", "trusted", "expected"), [
    (None, 0, "10.0.0.9"),  # Ninja would trust the header; ours ignores it without trusted proxies
    (None, 1, "203.0.113.7"),  # RATELIMIT['TRUSTED_PROXIES']: one trusted hop
    (1, 0, "203.0.113.7"),  # NINJA_NUM_PROXIES: Ninja's own rule
    (2, 0, "198.51.100.1"),
    (0, 0, "10.0.0.9"),
])
def test_client_addresses(settings: Any, num_proxies: int | None, trusted: int, expected: str) -> None:
    settings.NINJA_NUM_PROXIES = num_proxies
    settings.RATELIMIT = {**settings.RATELIMIT, "TRUSTED_PROXIES": trusted}
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.9", HTTP_X_FORWARDED_FOR="198.51.100.1, 203.0.113.7")
    assert AnonRateThrottle("1/m").get_ident(request) == expected


def test_ipv6_clients_are_counted_per_network(settings: Any) -> None:
    settings.NINJA_NUM_PROXIES = None
    throttle = AnonRateThrottle("1/m")
    first = RequestFactory().get("/", REMOTE_ADDR="2001:db8::1")
    neighbour = RequestFactory().get("/", REMOTE_ADDR="2001:db8::2")
    assert throttle.get_ident(first) == throttle.get_ident(neighbour) == "2001:db8::/64"
    assert [throttle.allow_request(first), throttle.allow_request(neighbour)] == [True, False]


def test_authenticated_and_anonymous_clients(client: Any) -> None:
    # AnonRateThrottle leaves authenticated requests alone; AuthRateThrottle counts each request.auth
    alice = [client.get("/ninja/auth", HTTP_X_TOKEN="alice-token").status_code for _ in range(3)]
    assert alice == [200, 200, 429]
    assert client.get("/ninja/auth", HTTP_X_TOKEN="bob-token").status_code == 200
    assert client.get("/ninja/auth").status_code == 401  # Ninja's authentication refuses first


def test_anonymous_clients_are_limited_by_address(client: Any) -> None:
    assert client.get("/ninja/optional-auth", HTTP_X_TOKEN="alice-token").status_code == 200
    assert client.get("/ninja/optional-auth", HTTP_X_TOKEN="alice-token").status_code == 200
    # the fallback authenticator gives request.auth too, so Ninja's AnonRateThrottle (and ours) skip it
    assert client.get("/ninja/optional-auth").status_code == 200


@pytest.mark.django_db
def test_each_user_is_counted_apart(client: Any, django_user_model: Any) -> None:
    alice = django_user_model.objects.create_user("alice", password="pw")
    bob = django_user_model.objects.create_user("bob", password="pw")
    client.force_login(alice)
    assert [client.get("/ninja/user").status_code for _ in range(3)] == [200, 200, 429]
    client.force_login(bob)
    assert client.get("/ninja/user").status_code == 200
    client.logout()
    assert [client.get("/ninja/user").status_code for _ in range(3)] == [200, 200, 429]  # anonymous: by address


def test_several_throttles_decide_together_and_a_refused_request_charges_none(client: Any) -> None:
    # /stacked: anon 5/m and burst 2/m. The refused requests charge neither ...
    assert [client.get("/ninja/stacked").status_code for _ in range(5)] == [200, 200, 429, 429, 429]
    # ... so the same 5/m anon count (another operation, the same rate) has 3 requests left, not 0
    assert [client.get("/ninja/shared").status_code for _ in range(4)] == [200, 200, 200, 429]


def test_one_scope_with_two_rates_counts_each_rate_apart(client: Any) -> None:
    assert [client.get("/ninja/two-rates").status_code for _ in range(2)] == [200, 429]  # 1/m refuses
    # the 3/m count (shared by every anon throttle of that rate) was charged once, by the allowed request
    assert [client.get("/ninja/three").status_code for _ in range(3)] == [200, 200, 429]


def test_a_throttle_with_a_django_cache_is_refused_when_defined() -> None:
    with pytest.raises(ImproperlyConfigured, match="count in Redis"):
        class Cached(AnonRateThrottle):
            cache = object()  # type: ignore[assignment]


def test_router_level_throttles_and_an_operation_overruling_them(client: Any) -> None:
    assert [client.get("/ninja/router/routed").status_code for _ in range(3)] == [200, 200, 429]
    assert [client.get("/ninja/router/overruled").status_code for _ in range(5)] == [200, 200, 200, 200, 429]


@pytest.fixture
def small_key(db: Any) -> str:
    return make_key(make_tier("small", [("burst", "token_bucket", 1, 3600, 3, "")]))


def test_tier_throttle_enforces_the_keys_tier(client: Any, small_key: str) -> None:
    responses = [client.get("/tiered/data", HTTP_X_API_KEY=small_key) for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["2", "1", "0", "0"]
    assert responses[-1]["X-RateLimit-Tier"] == "small"
    assert 1 <= int(responses[-1]["Retry-After"]) <= 3600


@pytest.fixture
def committed_key(transactional_db: Any) -> str:
    """A key of the "small" tier that another thread can read (the test's writes are committed)."""
    return make_key(make_tier("small", [("burst", "token_bucket", 1, 3600, 3, "")]))


def test_tier_throttle_on_an_async_operation_under_asgi(committed_key: str, monkeypatch: Any) -> None:
    """Ninja asks throttles synchronously, on the event loop for an `async def` operation: a key this
    process has not looked up yet is read in a thread of its own; once cached, the request is planned
    and decided on the loop's thread."""
    planned_in = record_planning_threads(monkeypatch)

    async def scenario() -> list[int]:
        client = AsyncClient()
        headers = {"X-API-Key": committed_key}
        return [(await client.get("/tiered/async-data", headers=headers)).status_code for _ in range(4)]

    loop_thread = threading.get_ident()  # asyncio.run runs the loop in this thread
    assert run(scenario) == [200, 200, 200, 429]
    assert planned_in[0] == loop_thread and planned_in[1] != loop_thread  # cold: tried on the loop, then a thread
    assert planned_in[2:] == [loop_thread] * 3  # warm


@pytest.mark.django_db
def test_tier_throttle_gives_the_authenticated_users_tier(client: Any, django_user_model: Any) -> None:
    make_tier("member", [("minute", "sliding_window", 2, 60, None, "")])
    user = django_user_model.objects.create_user("carol", password="pw")
    settings_user_tier = user.ratelimit_tier if hasattr(user, "ratelimit_tier") else None
    assert settings_user_tier is None
    client.force_login(user)
    responses = [client.get("/tiered/session") for _ in range(2)]
    assert all(r.status_code == 200 for r in responses)
    assert responses[0]["X-RateLimit-Tier"] == "free"  # RATELIMIT['DEFAULT_USER_TIER']


def test_in_sync_code_runs_in_place_unless_it_needs_io_on_an_event_loop() -> None:
    def where() -> str:
        return threading.current_thread().name

    def needs_io() -> str:
        require_io()  # what a cold lookup does under local_only()
        return threading.current_thread().name

    here = threading.current_thread().name
    assert _in_sync_code(where) == here and _in_sync_code(needs_io) == here  # off a loop: as it is

    async def on_a_loop() -> tuple[str, str]:
        return _in_sync_code(where), _in_sync_code(needs_io)

    assert asyncio.run(on_a_loop()) == (here, "ratelimit-sync-decision")

    def fails() -> str:
        require_io()
        raise ValueError("raised in the thread")

    async def failing() -> str:
        return _in_sync_code(fails)

    with pytest.raises(ValueError, match="raised in the thread"):
        asyncio.run(failing())


def tokens_key(slug: str) -> str:
    """A key of a tier of 100 requests and 1,000 tokens a minute (an exact sliding window)."""
    tier = make_tier(slug, [("minute", "fixed_window", 100, 60, None, "")])
    TierLimit.objects.create(tier=tier, name="tokens", algorithm="sliding_window", limit=1000, period=60,
                             unit="tokens")
    return make_key(tier)


@pytest.mark.django_db
def test_an_operation_reserves_its_estimate_in_the_throttles_call_and_settles_what_it_used(client: Any) -> None:
    key = tokens_key("ninjatokens")
    statuses = [client.post("/tiered/chat", {"max_tokens": 500}, content_type="application/json",
                            HTTP_X_API_KEY=key).status_code for _ in range(10)]
    # as under the middleware alone: 6 admitted (5 x 100 used and 500 reserved fit in 1,000; a 7th would
    # need 500 more than the 400 left), every reservation settled exactly at the 100 used
    assert statuses == [200] * 6 + [429] * 4
    bad = client.post("/tiered/chat", {"max": 1}, content_type="application/json", HTTP_X_API_KEY=key)
    assert bad.status_code == 400 and "tokens" in bad.json()["detail"]


def test_an_async_operation_under_asgi_reserves_and_settles_alike(transactional_db: Any) -> None:
    key = tokens_key("ninjaasynctokens")

    async def scenario() -> list[int]:
        client = AsyncClient()
        return [(await client.post("/tiered/async-chat", {"max_tokens": 500}, content_type="application/json",
                                   headers={"X-API-Key": key})).status_code for _ in range(10)]

    assert run(scenario) == [200] * 6 + [429] * 4  # settled at 100 each as the response ended
