"""RATELIMIT['ERROR_FORMAT'] = "problem": refusals as RFC 9457 problem details with the problem types of
draft-ietf-httpapi-ratelimit-headers; "json" (the default) keeps today's bodies. HEADER_DRAFT is checked."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import path

from devtools.embedded import free_port
from project.urls import urlpatterns as demo_urlpatterns
from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.decorators import ratelimit
from ratelimit_app.models import ClientRule
from tests.support.limits_support import make_key, make_tier

pytestmark = pytest.mark.django_db

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
REDUCED_CAPACITY = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"


@ratelimit(rate="1/h", key="ip", name="quote-hourly")
def decorated(request: Any) -> Any:
    from django.http import JsonResponse

    return JsonResponse({"ok": True})


urlpatterns = [*demo_urlpatterns, path("public/decorated", decorated)]


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


def assert_rfc9457(response: Any) -> dict[str, Any]:
    """The body is a problem details object (RFC 9457 section 3): its members have the RFC's types, and
    `status` is the response's status code."""
    assert response["Content-Type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert isinstance(body["type"], str) and (body["type"] == "about:blank" or body["type"].startswith("https://"))
    assert isinstance(body["title"], str) and body["title"]
    assert body["status"] == response.status_code and type(body["status"]) is int
    assert isinstance(body["detail"], str)
    assert "instance" not in body or isinstance(body["instance"], str)
    return body


def test_json_stays_the_default(client: Client, settings: Any) -> None:
    use(settings, IP_RATE=None)
    key = make_key(make_tier("t", [("minute", "fixed_window", 1, 3600, None, "")]))
    client.get("/api/users", HTTP_X_API_KEY=key)
    refused = client.get("/api/users", HTTP_X_API_KEY=key)
    assert refused.status_code == 429 and refused["Content-Type"] == "application/json"
    assert set(refused.json()) == {"error", "tier", "policy", "retry_after"}


def test_a_429_is_quota_exceeded_with_the_violated_policies(client: Client, settings: Any) -> None:
    use(settings, IP_RATE=None, ERROR_FORMAT="problem")
    key = make_key(make_tier("t", [("minute", "fixed_window", 1, 3600, None, ""),
                                   ("day", "fixed_window", 1, 86400, None, "")]))
    assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200
    refused = client.get("/api/users", HTTP_X_API_KEY=key)
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    body = assert_rfc9457(refused)
    assert body["type"] == QUOTA_EXCEEDED
    assert body["title"] == "Request cannot be satisfied as assigned quota has been exceeded"
    assert body["violated-policies"] == ["minute", "day"]
    assert body["detail"] == "rate limit exceeded" and body["tier"] == "t" and body["retry_after"] > 0
    assert "RateLimit" in refused  # the headers keep following the draft


def test_a_503_is_temporary_reduced_capacity(client: Client, settings: Any) -> None:
    key = make_key(make_tier("t", [("minute", "sliding_window", 5, 60, None, "")], fail_mode="closed"))
    assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200
    use(settings, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", ERROR_FORMAT="problem",
        SOCKET_CONNECT_TIMEOUT=0.2, SOCKET_TIMEOUT=0.2, BUDGET_MS=500)
    refused = client.get("/api/users", HTTP_X_API_KEY=key)
    assert refused.status_code == 503
    body = assert_rfc9457(refused)
    assert body["type"] == REDUCED_CAPACITY and "violated-policies" not in body
    assert body["detail"] == "rate limiter unavailable"


def test_401_and_403_are_about_blank_problems(client: Client, settings: Any) -> None:
    use(settings, ERROR_FORMAT="problem")
    unauthorized = client.get("/api/users", HTTP_X_API_KEY="nonsense")
    body = assert_rfc9457(unauthorized)
    assert (body["type"], body["title"], body["detail"]) == ("about:blank", "Unauthorized", "malformed API key")
    ClientRule.objects.create(action="deny", network="192.0.2.0/24")
    forbidden = client.get("/api/users", REMOTE_ADDR="192.0.2.5")
    body = assert_rfc9457(forbidden)
    assert (body["type"], body["title"]) == ("about:blank", "Forbidden")


@pytest.mark.urls(__name__)
def test_the_decorator_answers_in_the_chosen_format(client: Client, settings: Any) -> None:
    use(settings, ERROR_FORMAT="problem")
    assert client.get("/public/decorated").status_code == 200
    body = assert_rfc9457(client.get("/public/decorated"))
    assert body["violated-policies"] == ["quote-hourly"]


@pytest.mark.parametrize(("name", "value", "read"), [("ERROR_FORMAT", "xml", "json"),
                                                    ("HEADER_DRAFT", "draft-12", "draft-11")])
def test_unknown_formats_are_refused_naming_the_setting(settings: Any, name: str, value: str, read: str) -> None:
    from ratelimit_app.conf.settings import read_settings

    use(settings, **{name: value})
    errors = read_settings()[1]
    assert [error.setting for error in errors] == [name] and f"RATELIMIT['{name}']" in errors[0].message
    assert getattr(ratelimit_settings, name) == read  # at run time, a refusal is still answered
