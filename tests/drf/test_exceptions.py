"""ratelimit_app.drf.exceptions: what the throttle carrying the request's own limits raises when they
refuse it for a reason other than a rate (401, 403, 503), as DRF answers it; views dispatched directly
(no middleware) against the real Redis and database."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from devtools.embedded import RedisProcess
from ratelimit_app import new_lease_token
from ratelimit_app.apply import shedding
from ratelimit_app.apply.shedding import FLEET_IDENTITY, LOW, shed_config
from ratelimit_app.drf.exceptions import ClientRefused, InvalidApiKey, LimiterUnavailable, Overloaded
from ratelimit_app.models import ClientRule
from ratelimit_app.service.limiter import get_limiter
from ratelimit_app.throttling import TierRateThrottle
from tests.support.limits_support import make_key, make_tier

factory = APIRequestFactory()


class Tiered(APIView):
    throttle_classes = [TierRateThrottle]

    def get(self, request: Any) -> Response:
        return Response("ok")


def get(**headers: Any) -> Any:
    return Tiered.as_view()(factory.get("/api/things", REMOTE_ADDR="192.0.2.10", **headers))


@pytest.mark.django_db
def test_an_unusable_key_is_a_401_with_a_bearer_challenge() -> None:
    response = get(HTTP_X_API_KEY="not-a-key")
    assert response.status_code == 401 and response["WWW-Authenticate"] == InvalidApiKey.auth_header
    assert response.data == {"detail": "malformed API key"}
    assert response.data["detail"].code == "invalid_api_key"


@pytest.mark.django_db
def test_a_deny_rule_is_a_403() -> None:
    key = make_key(make_tier("drfdeny", [("minute", "fixed_window", 10, 60, None, "")]))
    ClientRule.objects.create(action="deny", network="192.0.2.0/24")
    response = get(HTTP_X_API_KEY=key)
    assert response.status_code == 403 and response.data["detail"].code == ClientRefused.default_code


@pytest.mark.django_db
def test_a_limiter_that_cannot_decide_under_the_closed_fail_mode_is_a_503_with_retry_after(
    settings: Any, server: RedisProcess
) -> None:
    key = make_key(make_tier("drfdown", [("minute", "fixed_window", 10, 60, None, "")]))
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url, "FAIL_MODE": "closed",
                          "BREAKER_FAILURES": 1, "BREAKER_COOLDOWN": 7.0, "BREAKER_MAX_COOLDOWN": 7.0}
    server.stop()
    response = get(HTTP_X_API_KEY=key)
    assert response.status_code == 503 and response.data["detail"].code == LimiterUnavailable.default_code
    assert response["Retry-After"] == "7"  # when the breaker will try Redis again


@pytest.mark.django_db
def test_a_shed_request_is_a_503_overloaded_with_the_shedders_retry_after(settings: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shedding, "fleet_episode", shedding._Episode("fleet"))  # this test's episode alone
    key = make_key(make_tier("drfshed", [("minute", "fixed_window", 10, 60, None, "")]))
    settings.RATELIMIT = {**settings.RATELIMIT, "SHED_CAPACITY": 2, "SHED_LOW_AT": 0.5, "SHED_RETRY_AFTER": 3,
                          "SHED_PRIORITIES": {"/api/things": "low"}}
    low = shed_config().thresholds[LOW]  # one low-priority request in flight fills it
    assert get_limiter().hit(FLEET_IDENTITY, (low,), lease=new_lease_token()).allowed
    response = get(HTTP_X_API_KEY=key)
    assert response.status_code == 503 and response.data["detail"].code == Overloaded.default_code
    assert str(response.data["detail"]) == "Service overloaded: low-priority request shed."
    assert response["Retry-After"] == "3"
