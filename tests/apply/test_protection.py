"""Concurrency slots and load shedding in the request path (Django's test client, real Redis, real DB).

Live servers (gunicorn, uvicorn) are in tests/test_protection_live.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.urls import path
from rest_framework.views import APIView

from project.urls import urlpatterns as demo_urlpatterns
from ratelimit_app.apply.shedding import FLEET_IDENTITY, FLEET_POLICY, in_flight
from ratelimit_app.core.policies import InvalidPolicy
from ratelimit_app.decorators import limit_concurrency, limit_cost
from ratelimit_app.observability.queries import get_metrics
from ratelimit_app.observability.recorder import flush
from ratelimit_app.service.limiter import get_limiter
from ratelimit_app.throttling import ConcurrencyThrottle, RateLimitHeadersMixin
from tests.support.limits_support import make_key, make_tier, parse_ietf

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


class Boom(Exception):
    pass


def boom(request: HttpRequest) -> JsonResponse:
    raise Boom("the view failed")


def streaming(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(iter([b"a", b"b", b"c"]))


@limit_cost(priority="low")
def low(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(iter([b"low"]))


@limit_cost(priority="critical")
def critical(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(iter([b"critical"]))


@limit_concurrency(1, key="ip", lease=30)
def single(request: HttpRequest) -> StreamingHttpResponse:
    return StreamingHttpResponse(iter([b"single"]))


class TwoAtOnce(ConcurrencyThrottle):
    slots = 2
    lease = 30
    scope = "two-at-once"


class ThrottledStream(RateLimitHeadersMixin, APIView):
    throttle_classes = [TwoAtOnce]

    def get(self, request: Any) -> StreamingHttpResponse:
        return StreamingHttpResponse(iter([b"drf"]))


class Unreleased(APIView):
    throttle_classes = [TwoAtOnce]


urlpatterns = [
    path("drf/unreleased", Unreleased.as_view()),
    path("api/boom", boom),
    path("api/streaming", streaming),
    path("api/low", low),
    path("api/critical", critical),
    path("public/single", single),
    path("drf/two", ThrottledStream.as_view()),
    *demo_urlpatterns,
]


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


@pytest.fixture
def two_slot_key() -> str:
    """A key of a tier with 2 slots (30 s leases) and a roomy rate limit."""
    return make_key(make_tier("twoslots", [("minute", "fixed_window", 1000, 60, None, ""),
                                           ("concurrency", "concurrency", 2, 30, None, "")]))


def get(client: Any, url: str, key: str | None = None) -> Any:
    return client.get(url, **({"HTTP_X_API_KEY": key} if key else {}))


def free_slots(key: str) -> int:
    """What the tier's concurrency policy has free now (a peek: charges nothing)."""
    from ratelimit_app.core.policies import Policy

    prefix = key.split(".")[0]
    return get_limiter().peek(f"key:{prefix}", [Policy("concurrency", "concurrency", limit=2, period=30)]).remaining


def test_a_streaming_response_holds_its_slot_until_it_is_closed(client: Any, two_slot_key: str) -> None:
    first, second = get(client, "/api/streaming", two_slot_key), get(client, "/api/streaming", two_slot_key)
    assert first.status_code == second.status_code == 200 and free_slots(two_slot_key) == 0
    refused = get(client, "/api/streaming", two_slot_key)
    assert refused.status_code == 429 and refused["Retry-After"] == "1"
    assert refused.json()["policy"] == "concurrency" and refused.json()["retry_after"] == 1.0
    assert parse_ietf(refused["RateLimit-Policy"])["concurrency"] == {"q": 2, "qu": "concurrent-requests"}
    # the test client closes a streaming response once its content is read to the end, as servers do
    assert b"".join(first.streaming_content) == b"abc" and free_slots(two_slot_key) == 1
    second.close()  # a client that goes away mid-stream: the server closes the response
    assert free_slots(two_slot_key) == 2


def test_a_view_that_raises_gives_its_slot_back(client: Any, two_slot_key: str) -> None:
    client.raise_request_exception = True
    for _ in range(3):  # more than the slots: each one was given back
        with pytest.raises(Boom):
            get(client, "/api/boom", two_slot_key)
    assert free_slots(two_slot_key) == 2
    client.raise_request_exception = False
    assert get(client, "/api/boom", two_slot_key).status_code == 500
    assert free_slots(two_slot_key) == 2


def test_a_refusal_for_want_of_a_slot_charges_no_rate_limit(client: Any, two_slot_key: str) -> None:
    held = [get(client, "/api/streaming", two_slot_key) for _ in range(2)]
    for _ in range(5):
        assert get(client, "/api/streaming", two_slot_key).status_code == 429
    for response in held:
        response.close()
    status = get(client, "/api/rate-limit/status", two_slot_key).json()
    remaining = {limit["name"]: limit["remaining"] for limit in status["limits"]}
    # all or nothing: the IP's limit too (its third unit: the status call itself)
    assert remaining == {"ip": 97, "minute": 998, "concurrency": 2}
    # the legacy headers of an allowed request describe the rate limit nearest to refusing, not the slots
    response = get(client, "/api/streaming", two_slot_key)
    assert response["X-RateLimit-Limit"] == "100" and response["X-RateLimit-Remaining"] == "96"
    response.close()


def test_limit_concurrency_on_a_plain_view(client: Any) -> None:
    held = get(client, "/public/single")
    refused = get(client, "/public/single")
    assert held.status_code == 200 and refused.status_code == 429
    assert refused["Retry-After"] == "1" and refused.json()["policy"] == "single"
    held.close()
    again = get(client, "/public/single")
    assert again.status_code == 200
    again.close()


def test_limit_concurrency_checks_its_arguments_when_applied() -> None:
    with pytest.raises(InvalidPolicy, match=r"@limit_concurrency on .*single: slots: 0"):
        limit_concurrency(0)(single)
    with pytest.raises(InvalidPolicy, match="lease"):
        limit_concurrency(2, lease=0)(single)
    with pytest.raises(ValueError, match="key"):
        limit_concurrency(2, key="nope")(single)
    with pytest.raises(ValueError, match="priority"):
        limit_cost(priority="urgent")(single)


def test_the_drf_concurrency_throttle(client: Any) -> None:
    held = [get(client, "/drf/two") for _ in range(2)]
    assert [r.status_code for r in held] == [200, 200]
    refused = get(client, "/drf/two")
    assert refused.status_code == 429 and refused["Retry-After"] == "1"
    held[0].close()
    again = get(client, "/drf/two")
    assert again.status_code == 200
    for response in (held[1], again):
        response.close()
    for _ in range(3):  # each closed at once: its slot is back before the next
        response = get(client, "/drf/two")
        assert response.status_code == 200
        response.close()


def test_a_concurrency_throttle_is_checked_when_defined() -> None:
    with pytest.raises(ImproperlyConfigured, match="Broken.*slots 0"):
        type("Broken", (ConcurrencyThrottle,), {"slots": 0})


# -- load shedding ---------------------------------------------------------------------------------

def fleet_in_flight() -> int:
    from ratelimit_app.core.policies import Policy

    policy = Policy(FLEET_POLICY, "concurrency", limit=1000, period=60)
    return 1000 - get_limiter().peek(FLEET_IDENTITY, [policy]).remaining


def test_the_fleet_sheds_low_then_normal_never_critical(client: Any, settings: Any, caplog: Any) -> None:
    use(settings, SHED_CAPACITY=10, SHED_PRIORITIES={"/api/users": "low"})
    key = make_key(make_tier("roomy", [("minute", "sliding_window", 1000, 60, None, "")]))  # no window edge
    held = []
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    # 8 in flight (0.8 x 10): the next low-priority request is shed, a normal one still admitted
    for _ in range(8):
        held.append(get(client, "/api/low", key))
    assert [r.status_code for r in held] == [200] * 8 and fleet_in_flight() == 8
    shed = get(client, "/api/low", key)
    assert shed.status_code == 503 and shed["Retry-After"] == "1"
    assert shed.json() == {"error": "service overloaded: request shed", "priority": "low", "retry_after": 1.0}
    assert "RateLimit" not in shed and get(client, "/api/users", key).status_code == 503  # low by prefix
    held.append(get(client, "/api/streaming", key))  # normal: admitted up to floor(0.95 x 10) = 9
    assert held[-1].status_code == 200 and get(client, "/api/streaming", key).status_code == 503
    for _ in range(3):  # critical: counted, never shed
        held.append(get(client, "/api/critical", key))
        assert held[-1].status_code == 200
    assert fleet_in_flight() == 12
    assert sum("ratelimit.shed_started" in r.getMessage() for r in caplog.records) == 1  # once per episode
    # a shed request charged nothing
    remaining = {lim["name"]: lim["remaining"] for lim in get(client, "/api/rate-limit/status", key).json()["limits"]}
    assert remaining["minute"] == 1000 - 12
    for response in held:
        response.close()
    assert fleet_in_flight() == 0
    assert get(client, "/api/low", key).status_code == 200
    flush()
    policies = {p.policy: p.blocked for p in get_metrics().policies}
    assert policies["shed.low"] == 2 and policies["shed.normal"] == 1


@pytest.mark.parametrize("sent", [
    "/api/checkout/../streaming",           # the path a client sends, resolved as a server resolves it
    "/api/checkout/%2e%2e/streaming",       # percent-encoded dots
    "/api/checkout%2F..%2Fstreaming",       # percent-encoded slashes
    "/api/checkout//../streaming",          # a repeated slash
    "/api/streaming/../checkout/x",         # read as sent it is under /api/streaming: no priority gained
])
def test_a_path_gets_no_priority_from_dot_segments_or_encodings(client: Any, settings: Any, sent: str) -> None:
    use(settings, SHED_CAPACITY=10, SHED_LOW_AT=0.1,
        SHED_PRIORITIES={"/api/checkout": "critical", "/api/streaming": "low"})
    key = make_key(make_tier("roomy", [("minute", "sliding_window", 1000, 60, None, "")]))
    held = get(client, "/api/low", key)  # the low threshold (1) is reached
    assert held.status_code == 200 and fleet_in_flight() == 1
    assert get(client, "/api/streaming", key).status_code == 503
    assert get(client, "/api/checkout/x", key).status_code == 404  # critical: admitted (no view there)
    shed = get(client, sent, key)
    assert shed.status_code == 503 and shed.json()["priority"] == "low"
    held.close()


def test_with_redis_down_the_fleet_shedder_follows_the_fail_mode(client: Any, settings: Any) -> None:
    from devtools.embedded import free_port

    key = make_key(make_tier("roomy", [("minute", "sliding_window", 1000, 60, None, "")]))  # no window edge
    # Looks the key up while Redis answers. Closed at the end: closing a streamed response in a test
    # closes the test's database connection, and a process that has not read the edit epoch yet
    # (a new settings, no Redis) looks the key up in the database again.
    first = get(client, "/api/low", key)
    use(settings, SHED_CAPACITY=10, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", BUDGET_MS=200,
        SOCKET_CONNECT_TIMEOUT=0.2, SOCKET_TIMEOUT=0.2)
    assert get(client, "/api/low", key).status_code == 200  # open (default): nothing is shed
    use(settings, FAIL_MODE="closed")
    assert get(client, "/api/low", key).status_code == 503
    use(settings, FAIL_MODE="local", APP_SERVERS=2)  # this process' share: floor(0.8 x 10) // 2 = 4
    held = [get(client, "/api/low", key) for _ in range(5)]
    assert [r.status_code for r in held] == [200] * 4 + [503]
    for response in held:
        response.close()
    assert get(client, "/api/low", key).status_code == 200  # given back in the local fallback
    first.close()


def test_the_process_shedder_needs_no_redis(client: Any, settings: Any) -> None:
    use(settings, SHED_PROCESS_LIMIT=1)
    key = make_key(make_tier("roomy", [("minute", "sliding_window", 1000, 60, None, "")]))  # no window edge
    held = get(client, "/api/critical", key)  # one request in flight in this process
    assert in_flight.count == 1
    shed = get(client, "/api/low", key)
    assert shed.status_code == 503 and shed.json()["priority"] == "low"
    assert "X-RateLimit-Remaining" not in shed  # refused before any decision: nothing charged on the way out
    anonymous = client.get("/api/low")
    assert anonymous.status_code == 503 and anonymous.json()["priority"] == "low"  # not a 401 charged late
    normal = get(client, "/api/streaming", key)
    assert normal.status_code == 200  # normal: never by the process shedder
    held.close()
    assert in_flight.count == 1  # the normal one is still open
    normal.close()
    assert in_flight.count == 0
    flush()
    assert {p.policy: p.blocked for p in get_metrics().policies}["process-shed.low"] == 2


@pytest.mark.parametrize(("name", "value", "message"), [
    ("SHED_CAPACITY", 0, "SHED_CAPACITY"),
    ("SHED_CAPACITY", "10", "SHED_CAPACITY"),
    ("SHED_LOW_AT", 0, "SHED_LOW_AT"),
    ("SHED_LOW_AT", 1.5, "SHED_LOW_AT"),
    ("SHED_NORMAL_AT", 0.5, "SHED_LOW_AT"),  # below the low threshold
    ("SHED_LEASE", 0, "SHED_LEASE"),
    ("SHED_PRIORITIES", {"api/": "low"}, "SHED_PRIORITIES"),
    ("SHED_PRIORITIES", {"/api/": "urgent"}, "SHED_PRIORITIES"),
    ("SHED_PROCESS_LIMIT", -1, "SHED_PROCESS_LIMIT"),
    ("SHED_RETRY_AFTER", 0.5, "SHED_RETRY_AFTER"),
])
def test_every_shedding_setting_is_validated(settings: Any, name: str, value: Any, message: str) -> None:
    from ratelimit_app.conf.settings import read_settings

    use(settings, **{name: value})
    errors = read_settings()[1]
    assert [error.setting for error in errors] == [message] and f"RATELIMIT['{message}']" in errors[0].message


def test_check_reports_a_bad_shedding_setting(settings: Any) -> None:
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    use(settings, SHED_LOW_AT=2)
    with pytest.raises(SystemCheckError, match=r"ratelimit.E001.*SHED_LOW_AT"):
        call_command("check")


def test_the_outcome_names_the_slots_it_holds(client: Any, two_slot_key: str) -> None:
    response = get(client, "/api/streaming", two_slot_key)
    slots = response.wsgi_request.ratelimit.outcome.slots
    assert slots is not None and [policy.name for _, policy in slots.held] == ["concurrency"]
    response.close()
    assert slots.released


def test_check_warns_when_nothing_gives_a_throttles_slots_back(settings: Any) -> None:
    from ratelimit_app.throttling_checks import check_throttle_settings

    assert not [m for m in check_throttle_settings() if m.id == "ratelimit.W012"]  # the middleware does
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "RateLimitMiddleware" not in m]
    warned = [m.msg for m in check_throttle_settings() if m.id == "ratelimit.W012"]
    assert any("test_protection.Unreleased uses TwoAtOnce" in m for m in warned)
    assert not any("ThrottledStream" in m for m in warned)  # the mixin gives its slots back
