"""A team's own API under /api/ keeps its callers when the team adopts the app as README says.

The views of this module stand for what a project had before it installed ratelimit_app: a view that
checks its own JWT (`Authorization: Bearer eyJ...`), DRF views authenticated by DRF's `Token ...` and by
a JWT, and a public view. With the settings README gives (no REQUIRE_API_KEY), each is served to its own
callers, limited (per IP, or by the user's tier when DRF has authenticated one and our throttle decides)
and with the rate limit headers; a value in our key format is ours and verified, so an unknown one is
still refused. With RATELIMIT['REQUIRE_API_KEY'] = True (the demo's settings), requests without one of
our keys get the 401 they always got.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient
from django.urls import path
from rest_framework.authentication import BaseAuthentication, TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.core.apikeys import generate_key
from ratelimit_app.throttling import TierRateThrottle
from tests.support.limits_support import make_key, parse_ietf, seed_tiers
from tests.test_asgi import run

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

DRF_TOKEN = "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"  # the shape of a DRF authtoken key


def _jwt(subject: str) -> str:
    """An unsigned JWT ("alg": "none") for `subject`: the team's own token format, read by its own code."""
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({'sub': subject})}."


JWT = _jwt("alice")


def _jwt_subject(request: Any) -> str | None:
    """The subject of the request's `Authorization: Bearer <JWT>`, or None."""
    scheme, _, token = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme != "Bearer" or not token.startswith("eyJ"):
        return None
    payload = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["sub"])


# -- the team's API, as it was before ratelimit_app ------------------------------------------------

def jwt_view(request: HttpRequest) -> JsonResponse:
    subject = _jwt_subject(request)
    if subject is None:
        return JsonResponse({"detail": "JWT required"}, status=401)
    return JsonResponse({"subject": subject})


def public_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"public": True})


class DemoTokenAuthentication(TokenAuthentication):
    """DRF's TokenAuthentication (`Authorization: Token <key>`) over one known token instead of the
    authtoken table."""

    def authenticate_credentials(self, key: str) -> tuple[Any, str]:
        if key != DRF_TOKEN:
            raise AuthenticationFailed("Invalid token.")
        return get_user_model().objects.get(username="bob"), key


class JWTAuthentication(BaseAuthentication):
    """What simplejwt's JWTAuthentication does for this module: `Authorization: Bearer <JWT>`."""

    def authenticate(self, request: Any) -> tuple[Any, str] | None:
        subject = _jwt_subject(request)
        if subject is None:
            return None
        return get_user_model().objects.get(username=subject), "jwt"

    def authenticate_header(self, request: Any) -> str:
        return 'Bearer realm="api"'


class TokenView(APIView):
    authentication_classes = [DemoTokenAuthentication]
    permission_classes = [IsAuthenticated]

    def get(self, request: Any) -> Response:
        return Response({"user": request.user.username})


class JWTThrottledView(APIView):
    """A DRF view of the team's, with our tier throttle added: the user DRF authenticated gets its tier."""

    authentication_classes = [JWTAuthentication]
    permission_classes = [IsAuthenticated]
    throttle_classes = [TierRateThrottle]

    def get(self, request: Any) -> Response:
        return Response({"user": request.user.username})


urlpatterns = [
    path("api/jwt", jwt_view),
    path("api/public", public_view),
    path("api/drf/token", TokenView.as_view()),
    path("api/drf/jwt", JWTThrottledView.as_view()),
]


# -- the settings README gives, over the demo's --------------------------------------------------

@pytest.fixture
def adopted(settings: Any) -> None:
    """RATELIMIT as README's three lines leave it: REQUIRE_API_KEY not written (the demo opts in)."""
    settings.RATELIMIT = {name: value for name, value in settings.RATELIMIT.items() if name != "REQUIRE_API_KEY"}
    seed_tiers()
    user_model = get_user_model()
    for name in ("alice", "bob"):
        user_model.objects.get_or_create(username=name)


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


def assert_limited_and_served(response: Any, status: int = 200) -> None:
    """Served by the view, with our rate limit headers (the per-IP limit's, for a request without our key)."""
    assert response.status_code == status, response.content
    assert response["X-RateLimit-Limit"] and response["X-RateLimit-Remaining"]
    assert "ip" in parse_ietf(response["RateLimit-Policy"])


CALLERS = [
    ("/api/jwt", {"HTTP_AUTHORIZATION": f"Bearer {JWT}"}, {"subject": "alice"}),
    ("/api/drf/token", {"HTTP_AUTHORIZATION": f"Token {DRF_TOKEN}"}, {"user": "bob"}),
    ("/api/public", {}, {"public": True}),
]


@pytest.mark.parametrize(("url", "credentials", "body"), CALLERS, ids=["jwt", "drf-token", "no-credentials"])
def test_the_teams_own_callers_are_served_with_rate_limit_headers(client: Any, adopted: None, url: str,
                                                                  credentials: dict[str, str], body: Any) -> None:
    response = client.get(url, **credentials)
    assert_limited_and_served(response)
    assert response.json() == body


def test_the_teams_own_authentication_still_refuses_what_it_refused(client: Any, adopted: None) -> None:
    no_jwt = client.get("/api/jwt")
    assert no_jwt.status_code == 401 and no_jwt.json() == {"detail": "JWT required"}  # the team's answer, not ours
    wrong_token = client.get("/api/drf/token", HTTP_AUTHORIZATION="Token 0000")
    assert wrong_token.status_code == 401 and wrong_token.json() == {"detail": "Invalid token."}
    assert no_jwt["X-RateLimit-Limit"] and wrong_token["X-RateLimit-Limit"]  # and both were limited


def test_requests_without_our_key_are_limited_per_ip(client: Any, adopted: None, settings: Any) -> None:
    use(settings, IP_RATE="3/m")
    answers = [client.get("/api/jwt", HTTP_AUTHORIZATION=f"Bearer {JWT}") for _ in range(2)]
    answers.append(client.get("/api/public"))
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert [answer["X-RateLimit-Remaining"] for answer in answers] == ["2", "1", "0"]
    refused = client.get("/api/public")
    assert refused.status_code == 429 and refused.json()["policy"] == "ip"


def test_the_anonymous_tier_applies_to_requests_without_our_key(client: Any, adopted: None, settings: Any) -> None:
    use(settings, ANONYMOUS_TIER="free")
    response = client.get("/api/jwt", HTTP_AUTHORIZATION=f"Bearer {JWT}")
    assert response.status_code == 200 and response["X-RateLimit-Tier"] == "free"


def test_the_user_drf_authenticated_gets_its_tier_from_our_throttle(client: Any, adopted: None) -> None:
    response = client.get("/api/drf/jwt", HTTP_AUTHORIZATION=f"Bearer {JWT}")
    assert response.status_code == 200 and response.json() == {"user": "alice"}
    assert response["X-RateLimit-Tier"] == "free"  # DEFAULT_USER_TIER
    assert client.get("/api/drf/jwt").status_code == 401  # DRF's own refusal: no credentials


@pytest.mark.parametrize("header", ["HTTP_X_API_KEY", "HTTP_AUTHORIZATION"])
def test_a_value_in_our_key_format_is_ours_and_an_unknown_one_is_refused(client: Any, adopted: None, header: str,
                                                                         settings: Any) -> None:
    use(settings, IP_RATE="3/m")
    unknown = generate_key()[1]
    value = f"Bearer {unknown}" if header == "HTTP_AUTHORIZATION" else unknown
    answers = [client.get("/api/public", **{header: value}) for _ in range(3)]
    assert [(a.status_code, a.json()) for a in answers] == [(401, {"error": "unknown API key"})] * 3
    # charged to the per-IP limit like any request: a flood of keys in our format stops there
    assert client.get("/api/public", **{header: value}).status_code == 429


def test_our_keys_still_get_their_tier(client: Any, adopted: None) -> None:
    key = make_key("pro")
    for headers in ({"HTTP_X_API_KEY": key}, {"HTTP_AUTHORIZATION": f"Bearer {key}"}):
        response = client.get("/api/public", **headers)
        assert response.status_code == 200 and response["X-RateLimit-Tier"] == "pro"


def test_a_value_of_another_format_in_x_api_key_is_the_teams_own(client: Any, adopted: None) -> None:
    # Django Ninja's APIKeyHeader and several DRF key packages read X-API-Key: a key of theirs is not ours
    response = client.get("/api/public", HTTP_X_API_KEY="team-key-4d2c91")
    assert_limited_and_served(response)


def test_a_one_mib_credential_not_ours_costs_no_lookup(client: Any, adopted: None,
                                                       django_assert_num_queries: Any) -> None:
    client.get("/api/public")  # the allow/deny rules are in this process' cache now
    for header, value in (("HTTP_X_API_KEY", "k" * 2**20), ("HTTP_AUTHORIZATION", "Bearer " + "k" * 2**20)):
        with django_assert_num_queries(0):
            assert_limited_and_served(client.get("/api/public", **{header: value}))


# -- the opt-in: REQUIRE_API_KEY ---------------------------------------------------------------------

@pytest.mark.parametrize(("credentials", "message"), [
    ({}, "API key required"),
    ({"HTTP_AUTHORIZATION": f"Token {DRF_TOKEN}"}, "API key required"),
    ({"HTTP_AUTHORIZATION": f"Bearer {JWT}"}, "malformed API key"),
    ({"HTTP_X_API_KEY": "team-key-4d2c91"}, "malformed API key"),
], ids=["no-credentials", "drf-token", "jwt", "x-api-key"])
def test_with_require_api_key_requests_without_our_key_get_401(client: Any, adopted: None, settings: Any,
                                                               credentials: dict[str, str], message: str) -> None:
    use(settings, REQUIRE_API_KEY=True)
    response = client.get("/api/public", **credentials)
    assert response.status_code == 401 and response.json() == {"error": message}
    assert response["WWW-Authenticate"].startswith("Bearer") and response["X-RateLimit-Limit"]
    assert client.get("/api/public", HTTP_X_API_KEY=make_key("free")).status_code == 200


def test_the_demo_opts_in(client: Any) -> None:
    seed_tiers()
    response = client.get("/api/public")
    assert response.status_code == 401 and response.json() == {"error": "API key required"}


# -- under ASGI: the same rule on the event loop ---------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_under_asgi_the_teams_callers_are_served_too(adopted: None) -> None:
    async def scenario() -> list[Any]:
        client = AsyncClient()
        # AsyncClient takes headers by name (its other keyword arguments go into the ASGI scope)
        return [await client.get(url, headers={name.removeprefix("HTTP_").replace("_", "-"): value
                                               for name, value in credentials.items()})
                for url, credentials, _ in CALLERS]

    for response, (_, _, body) in zip(run(scenario), CALLERS, strict=True):
        assert_limited_and_served(response)
        assert response.json() == body
