"""RateLimitMiddleware through Django's test client against the real Redis: identification, 401/429/503
answers, headers, route costs and scopes, user and anonymous tiers, zero warm queries (the one Redis round
trip of a request: tests/test_round_trips.py)."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.response import Response
from rest_framework.views import APIView

from devtools.embedded import free_port
from project.urls import urlpatterns as demo_urlpatterns
from ratelimit_app.apply import limiting
from ratelimit_app.core.apikeys import generate_key
from ratelimit_app.decorators import limit_cost, ratelimit
from ratelimit_app.models import ApiKey, Tier, UserTier
from ratelimit_app.observability.queries import recent_metrics
from ratelimit_app.observability.recorder import flush
from tests.support.limits_support import make_key, make_tier, parse_ietf, seed_tiers, set_ip_rate

pytestmark = pytest.mark.django_db


# -- views of this module's URLconf (used with @pytest.mark.urls(__name__)) --------------------------
@limit_cost(1, scope="write")
def scoped_write(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@csrf_exempt
def plain(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


class ScopedApiView(APIView):
    throttle_scope = "write"  # the middleware uses a DRF view's throttle_scope as its scope

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


@ratelimit(rate="2/m", key="ip")
def decorated(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


urlpatterns = [
    *demo_urlpatterns,
    path("api/decorated", decorated),
    path("api/scoped/write", scoped_write),
    path("api/scoped/drf", ScopedApiView.as_view()),
    path("api/plain", plain),
]


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


@pytest.fixture
def small_key() -> str:
    """A key of a tier whose bucket holds 3 and refills one per hour (nothing refills during a test)."""
    tier = make_tier("small", [("burst", "token_bucket", 1, 3600, 3, ""),
                               ("day", "fixed_window", 1000, 86400, None, "")])
    return make_key(tier)


def get(client: Any, url: str = "/api/users", key: str | None = None, **extra: Any) -> Any:
    if key is not None:
        extra["HTTP_X_API_KEY"] = key
    return client.get(url, **extra)


def test_warm_request_makes_no_database_query(client: Any, django_assert_num_queries: Any) -> None:
    seed_tiers()
    key = make_key("free")
    assert get(client, key=key).status_code == 200  # cold: loads the key and the tier
    with django_assert_num_queries(0):
        for _ in range(5):
            response = get(client, key=key)
            assert response.status_code == 200 and response["X-RateLimit-Tier"] == "free"


def test_only_configured_paths_are_limited(client: Any, settings: Any) -> None:
    assert client.get("/health").status_code == 200
    assert "X-RateLimit-Limit" not in client.get("/health")
    use(settings, EXEMPT_PATHS=["/health", "/api/users"])
    response = get(client)
    assert response.status_code == 200 and "X-RateLimit-Limit" not in response
    assert get(client, "/api/rate-limit/status").status_code == 401
    use(settings, EXEMPT_PATHS=["/health"], ENABLED=False)
    assert get(client).status_code == 200


@pytest.mark.parametrize(("exempt", "prefixes", "limited", "unlimited"), [
    (["/api/health"], ["/api/"], ["/api/healthcare/records", "/api/healthz"], ["/api/health", "/api/health/db"]),
    (["/api/health/"], ["/api/"], ["/api/healthcare"], ["/api/health", "/api/health/db"]),  # the same prefix
    ([], ["/api/users"], ["/api/users", "/api/users/7"], ["/api/users-export", "/api/usersx/1"]),
    ([], ["/api/"], ["/api", "/api/users"], ["/apis/users", "/apix"]),  # "/api/" is "/api" and below
    (["/api/health"], ["/api/"], [  # no reading of the path escapes a limit
        "/api/health/../users", "/api/health/%2e%2e/users", "/api/health%2F..%2Fusers", "/api/health/./../users",
        "/api//health/../users", "/api/health//../users", "/api/users/../health/x"], []),
    (["/health"], ["/api/"], ["/health/../api/users", "/health/%2E%2E/api/users", "/health//../api/x"], ["/health/x"]),
])
def test_paths_match_by_segment_after_normalisation(client: Any, settings: Any, exempt: list[str],
                                                    prefixes: list[str], limited: list[str],
                                                    unlimited: list[str]) -> None:
    seed_tiers()
    key = make_key("free")
    use(settings, EXEMPT_PATHS=exempt, PATH_PREFIXES=prefixes)
    assert [path for path in limited if "X-RateLimit-Limit" not in get(client, path, key)] == []
    assert [path for path in unlimited if "X-RateLimit-Limit" in get(client, path, key)] == []


@pytest.mark.parametrize(("make", "message"), [
    (lambda: None, "API key required"),
    (lambda: "not-a-key", "malformed API key"),
    (lambda: generate_key()[1], "unknown API key"),
    (lambda: make_key("free")[:-4] + "AAAA", "unknown API key"),  # a real prefix, a wrong secret
    (lambda: _revoked_key(), "API key revoked"),
    (lambda: make_key("free", expires=_past()), "API key expired"),
])
def test_unusable_keys_get_401_with_a_clear_message(client: Any, make: Any, message: str) -> None:
    seed_tiers()
    key = make()
    response = get(client, key=key)
    assert response.status_code == 401
    assert response.json() == {"error": message}
    assert response["WWW-Authenticate"].startswith("Bearer")
    if key:
        assert key not in response.content.decode() and key.split(".")[-1] not in str(response.headers)


def test_bearer_authorization_is_accepted(client: Any) -> None:
    seed_tiers()
    key = make_key("free")
    response = client.get("/api/users", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200 and response["X-RateLimit-Tier"] == "free"


def _revoked_key() -> str:
    key = make_key("free")
    api_key = ApiKey.objects.get(prefix=key.split(".")[0])
    api_key.revoked = True
    api_key.save()
    return key


def _past() -> Any:
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() - timedelta(seconds=1)


def test_invalid_keys_are_charged_to_the_per_ip_limit(client: Any, settings: Any) -> None:
    use(settings, IP_RATE="3/m")
    statuses = [get(client, key="bad-" + str(i)).status_code for i in range(3)]
    assert statuses == [401, 401, 401]
    response = get(client, key="bad")
    assert response.status_code == 429
    body = response.json()
    assert body["policy"] == "ip" and body["tier"] is None and body["retry_after"] > 0
    assert int(response["Retry-After"]) == max(1, math.ceil(body["retry_after"]))
    # The IP's limit holds for valid keys too: it is counted before authentication.
    seed_tiers()
    assert get(client, key=make_key("free")).status_code == 429


def test_denial_is_429_json_with_retry_after_and_headers(client: Any, small_key: str) -> None:
    allowed = [get(client, key=small_key) for _ in range(3)]
    assert [r.status_code for r in allowed] == [200, 200, 200]
    assert [r["X-RateLimit-Remaining"] for r in allowed] == ["2", "1", "0"]
    denied = get(client, key=small_key)
    assert denied.status_code == 429 and denied["Content-Type"] == "application/json"
    body = denied.json()
    assert set(body) == {"error", "tier", "policy", "retry_after"}
    assert (body["tier"], body["policy"]) == ("small", "burst")
    # One token per hour: the wait is up to an hour, whole seconds in the header, rounded up.
    assert 0 < body["retry_after"] <= 3600
    assert int(denied["Retry-After"]) == math.ceil(body["retry_after"])
    assert (denied["X-RateLimit-Limit"], denied["X-RateLimit-Remaining"], denied["X-RateLimit-Tier"]) == (
        "3", "0", "small")
    assert parse_ietf(denied["RateLimit-Policy"])["burst"] == {"q": 3, "w": 10800}
    assert parse_ietf(denied["RateLimit"])["burst"]["r"] == 0


def test_a_denied_request_consumes_nothing(client: Any, small_key: str) -> None:
    for _ in range(3):
        get(client, key=small_key)
    before = get(client, "/api/rate-limit/status", key=small_key).json()
    for _ in range(5):
        assert get(client, key=small_key).status_code == 429
    after = get(client, "/api/rate-limit/status", key=small_key).json()
    remaining = {limit["name"]: limit["remaining"] for limit in after["limits"]}
    assert remaining == {limit["name"]: limit["remaining"] for limit in before["limits"]} | {"ip": 95}
    # only the 3 allowed requests counted, and each status call one unit of the per-IP limit
    assert remaining["day"] == 997 and remaining["ip"] == 100 - 3 - 2


def test_status_endpoint_reports_and_charges_the_per_ip_limit_alone(client: Any) -> None:
    seed_tiers()
    key = make_key("free")
    assert get(client, key=key).status_code == 200
    reports = [get(client, "/api/rate-limit/status", key=key) for _ in range(5)]
    assert all(r.status_code == 200 for r in reports)
    bodies = [r.json() for r in reports]
    assert bodies[0]["tier"] == "free" and bodies[0]["identity"] == "key:" + key.split(".")[0]
    assert [(lim["name"], lim["remaining"]) for lim in bodies[0]["limits"]] == [
        ("ip", 98), ("burst", 9), ("minute", 19), ("day", 999)]
    assert [b["limits"][0]["remaining"] for b in bodies] == [98, 97, 96, 95, 94]  # one unit per status call
    assert all(b["limits"][1:] == bodies[0]["limits"][1:] or
               [lim["remaining"] for lim in b["limits"][1:]] == [9, 19, 999] for b in bodies)
    assert get(client, key=key)["X-RateLimit-Remaining"] == "8"  # the next real request is the second


@pytest.mark.parametrize("key_kind", ["key", "anonymous"])
def test_status_calls_are_refused_over_the_per_ip_limit_from_the_deny_cache(client: Any, settings: Any,
                                                                          key_kind: str) -> None:
    # a key is held to its tier's own per-IP rate, an anonymous client to IP_RATE
    use(settings, IP_RATE="5/m", ANONYMOUS_TIER="free" if key_kind == "anonymous" else None,
        REQUIRE_API_KEY=key_kind == "key")
    seed_tiers()
    set_ip_rate("free", "5/m")
    key = make_key("free") if key_kind == "key" else None
    statuses = [get(client, "/api/rate-limit/status", key=key).status_code for _ in range(5)]
    assert statuses == [200] * 5
    refused = get(client, "/api/rate-limit/status", key=key)
    assert refused.status_code == 429 and refused.json()["policy"] == "ip" and int(refused["Retry-After"]) >= 1
    hits = limiting.get_limiter().stats().deny_cache_hits
    again = [get(client, "/api/rate-limit/status", key=key) for _ in range(20)]
    assert all(r.status_code == 429 for r in again)
    assert limiting.get_limiter().stats().deny_cache_hits - hits == 20  # answered without Redis
    assert get(client, key=key).status_code == 429  # the API too: one per-IP limit


def test_route_cost_is_charged_to_every_limit(client: Any) -> None:
    tier = make_tier("t", [("minute", "sliding_window", 12, 60, None, "")])
    key = make_key(tier)

    def post() -> Any:
        return client.post("/api/data", data="{}", content_type="application/json", HTTP_X_API_KEY=key)

    first, second, third = post(), post(), post()
    assert (first.status_code, first["X-RateLimit-Remaining"]) == (201, "7")
    assert (second.status_code, second["X-RateLimit-Remaining"]) == (201, "2")
    assert third.status_code == 429 and third.json()["policy"] == "minute"
    cheap = get(client, key=key)  # GET costs 1, and 2 are left
    assert (cheap.status_code, cheap["X-RateLimit-Remaining"]) == (200, "1")
    assert parse_ietf(cheap["RateLimit"])["ip"]["r"] == 100 - 5 - 5 - 1


def test_cost_above_capacity_can_never_succeed(client: Any) -> None:
    key = make_key(make_tier("tiny", [("burst", "token_bucket", 3, 60, None, "")]))
    response = client.post("/api/data", data="{}", content_type="application/json", HTTP_X_API_KEY=key)
    assert response.status_code == 429
    body = response.json()
    assert body["retry_after"] is None and "never" in body["error"] and body["policy"] == "burst"
    assert "Retry-After" not in response
    assert get(client, key=key).status_code == 200  # nothing was consumed


@pytest.mark.urls(__name__)
def test_scoped_limits_apply_only_to_views_of_that_scope(client: Any) -> None:
    tier = make_tier("scoped", [("minute", "sliding_window", 100, 60, None, ""),
                                ("minute", "sliding_window", 2, 60, None, "write")])
    key = make_key(tier)
    assert [get(client, "/api/scoped/write", key=key).status_code for _ in range(2)] == [200, 200]
    denied = get(client, "/api/scoped/write", key=key)
    assert denied.status_code == 429 and denied.json()["policy"] == "write.minute"
    assert "write.minute" in parse_ietf(denied["RateLimit-Policy"])
    # A DRF view with throttle_scope = "write" shares the scope's counter ...
    assert get(client, "/api/scoped/drf", key=key).status_code == 429
    # ... while unscoped views are limited by the base limits only.
    response = get(client, "/api/plain", key=key)
    assert response.status_code == 200 and "write.minute" not in response["RateLimit-Policy"]
    assert parse_ietf(response["RateLimit"])["minute"]["r"] == 100 - 3


def test_unresolved_api_paths_are_still_limited(client: Any, small_key: str) -> None:
    response = get(client, "/api/no-such-endpoint", key=small_key)
    assert response.status_code == 404 and response["X-RateLimit-Remaining"] == "2"
    assert get(client, "/api/no-such-endpoint").status_code == 401


def test_session_users_get_their_tier(client: Any, django_user_model: Any) -> None:
    seed_tiers()
    user = django_user_model.objects.create_user("alice", password="pw")
    client.force_login(user)
    response = get(client)
    assert response.status_code == 200 and response["X-RateLimit-Tier"] == "free"  # DEFAULT_USER_TIER
    assert get(client, "/api/rate-limit/status").json()["identity"] == f"user:{user.pk}"
    UserTier.objects.create(user=user, tier=Tier.objects.get(slug="pro"))
    assert get(client)["X-RateLimit-Tier"] == "pro"


def test_anonymous_clients_get_the_anonymous_tier_per_ip(client: Any, settings: Any) -> None:
    make_tier("anonymous", [("minute", "sliding_window", 2, 60, None, "")])
    use(settings, ANONYMOUS_TIER="anonymous", REQUIRE_API_KEY=False)
    assert [get(client).status_code for _ in range(2)] == [200, 200]
    denied = get(client)
    assert denied.status_code == 429 and denied.json()["tier"] == "anonymous"
    other_ip = get(client, REMOTE_ADDR="198.51.100.20")
    assert other_ip.status_code == 200
    # A presented key of ours that is not valid is refused, not downgraded to the anonymous tier; a value
    # that is not one of ours (a key of the project's own) is not ours to refuse.
    assert get(client, key=generate_key()[1], REMOTE_ADDR="198.51.100.21").status_code == 401
    assert get(client, key="nope", REMOTE_ADDR="198.51.100.22")["X-RateLimit-Tier"] == "anonymous"


@pytest.mark.parametrize(("mode", "status"), [("open", 200), ("closed", 503)])
def test_a_missing_tier_named_in_settings_follows_the_fail_mode_and_is_logged_once(
        client: Any, settings: Any, caplog: Any, mode: str, status: int) -> None:
    use(settings, ANONYMOUS_TIER="missing", FAIL_MODE=mode, REQUIRE_API_KEY=False)
    limiting._logged_causes.clear()
    with caplog.at_level(logging.DEBUG, logger="ratelimit_app"):
        assert [get(client).status_code for _ in range(3)] == [status] * 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "ratelimit_app"]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "RATELIMIT['ANONYMOUS_TIER'] names tier 'missing'" in errors[0].getMessage()


@pytest.mark.django_db
@pytest.mark.parametrize("ip_rate", ["lots", "ten/m", "0/m", "10/0s"])
def test_an_invalid_ip_rate_met_at_run_time_never_fails_the_site(client: Any, settings: Any, ip_rate: str) -> None:
    use(settings, IP_RATE=ip_rate, FAIL_MODE="closed")
    assert get(client).status_code == 503  # limited paths follow the fail mode
    assert client.get("/health").status_code == 200
    assert client.get("/admin/login/").status_code == 200


@pytest.mark.parametrize(("mode", "legacy", "ietf"), [("legacy", True, False), ("ietf", False, True),
                                                      ("both", True, True)])
def test_headers_setting(client: Any, settings: Any, mode: str, legacy: bool, ietf: bool) -> None:
    use(settings, HEADERS=mode)
    seed_tiers()
    response = get(client, key=make_key("free"))
    assert ("X-RateLimit-Remaining" in response) is legacy and ("X-RateLimit-Tier" in response) is legacy
    assert ("RateLimit" in response) is ietf and ("RateLimit-Policy" in response) is ietf


def test_ip_rate_none_disables_the_default_per_ip_limit_and_leaves_a_tiers_own(client: Any, settings: Any) -> None:
    use(settings, IP_RATE=None)
    seed_tiers()
    plain = make_tier("plain", [("minute", "fixed_window", 50, 60, None, "")])
    response = get(client, key=make_key(plain))
    assert response.status_code == 200 and "ip" not in parse_ietf(response["RateLimit-Policy"])
    assert get(client).status_code == 401
    # the seeded tiers set their own per-IP limit, which the default does not switch off
    response = get(client, key=make_key("free"))
    assert response.status_code == 200 and parse_ietf(response["RateLimit-Policy"])["ip"]["q"] == 100


def test_a_seeded_enterprise_key_sends_150_requests_from_one_address_none_refused(client: Any) -> None:
    seed_tiers()
    key = make_key("enterprise")
    responses = [get(client, key=key) for _ in range(150)]
    assert [r.status_code for r in responses] == [200] * 150
    shown = parse_ietf(responses[-1]["RateLimit-Policy"])
    assert shown["ip"]["q"] >= shown["minute"]["q"] == 2000


def test_a_free_key_from_one_address_is_still_held_to_the_free_plan(client: Any) -> None:
    seed_tiers()
    key = make_key("free")
    responses = [get(client, key=key) for _ in range(11)]
    assert [r.status_code for r in responses] == [200] * 10 + [429]  # the free bucket holds 10
    assert responses[-1].json()["policy"] == "burst"
    assert parse_ietf(responses[0]["RateLimit-Policy"])["ip"]["q"] == 100


def test_a_hundred_free_keys_from_one_address_share_the_free_per_ip_limit(client: Any, settings: Any) -> None:
    use(settings, IP_ALGORITHM="sliding_window")  # exact, whenever the minute turns
    seed_tiers()
    keys = [make_key("free", name=f"free {n}") for n in range(100)]
    first = [get(client, key=key).status_code for key in keys]
    second = [get(client, key=key) for key in keys]
    assert first == [200] * 100
    assert [r.status_code for r in second] == [429] * 100
    assert {r.json()["policy"] for r in second} == {"ip"}
    # the free keys' counter is the free tier's alone: an enterprise key and a keyless request from the
    # same address are counted apart
    assert get(client, key=make_key("enterprise")).status_code == 200
    assert get(client).status_code == 401


@pytest.mark.parametrize(("global_mode", "tier_mode", "status"), [
    ("open", "", 200), ("closed", "", 503), ("open", "closed", 503), ("closed", "open", 200),
])
def test_redis_down_follows_the_fail_mode(client: Any, settings: Any, global_mode: str, tier_mode: str,
                                          status: int) -> None:
    key = make_key(make_tier("t", [("minute", "sliding_window", 5, 60, None, "")], fail_mode=tier_mode))
    assert get(client, key=key).status_code == 200  # caches the key and tier while Redis is up
    use(settings, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", FAIL_MODE=global_mode,
        SOCKET_CONNECT_TIMEOUT=0.2, SOCKET_TIMEOUT=0.2, BUDGET_MS=500)
    response = get(client, key=key)
    assert response.status_code == status
    if status == 503:
        assert response.json()["error"] == "rate limiter unavailable" and int(response["Retry-After"]) >= 1
    else:
        assert "X-RateLimit-Remaining" not in response  # no counts were available to report


def test_ipv6_clients_share_their_prefix_limit(client: Any, settings: Any) -> None:
    use(settings, IP_RATE="2/m")
    assert get(client, REMOTE_ADDR="2001:db8:0:1::1").status_code == 401
    assert get(client, REMOTE_ADDR="2001:db8:0:1::2").status_code == 401
    assert get(client, REMOTE_ADDR="2001:db8:0:1:ffff::3").status_code == 429  # same /64
    assert get(client, REMOTE_ADDR="2001:db8:0:2::1").status_code == 401  # another /64


def test_each_limited_request_is_counted_once_in_the_metrics(client: Any, small_key: str) -> None:
    flush()
    before = recent_metrics(hours=2)
    for _ in range(4):
        get(client, key=small_key)
    get(client, key="bad")
    assert flush() is True
    after = recent_metrics(hours=2)
    tiers = {t.tier: (t.allowed, t.blocked) for t in after.tiers}
    old = {t.tier: (t.allowed, t.blocked) for t in before.tiers}
    assert tiers["small"][0] - old.get("small", (0, 0))[0] == 3
    assert tiers["small"][1] - old.get("small", (0, 0))[1] == 1
    assert after.total - before.total == 4
    assert after.unauthorized - before.unauthorized == 1  # the bad key: a 401, its own outcome
    prefix = small_key.split(".")[0]
    assert any(b.identity == f"key:{prefix}" for b in after.top_blocked)


@pytest.mark.urls(__name__)
def test_a_decorated_view_is_decided_with_the_tier_in_one_call(client: Any, small_key: str) -> None:
    responses = [get(client, "/api/decorated", key=small_key) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    assert responses[-1].json()["policy"] == "decorated"  # the decorator's limit refused ...
    assert responses[-1]["X-RateLimit-Limit"] == "2"  # ... and the headers describe it
    # ... and charged nothing: the tier's bucket of 3 still has 1 (2 served requests), the per-IP limit 98
    results = {r.policy: r.remaining for r in responses[-1].wsgi_request.ratelimit.outcome.decision.results}
    assert results["burst"] == 1 and results["ip"] == 98 and results["decorated"] == 0
