"""ratelimit_app.gateway.answers: `answer` (200 with the rate limit headers and an always-present lease
header, else the middleware's own refusal) and `under_contract` (as it is, or for nginx's auth_request a
403 carrying the status, body and headers), over outcomes of requests limited against the real Redis."""

from __future__ import annotations

import json

import pytest
from django.http import HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.test import RequestFactory

from ratelimit_app import Policy, new_lease_token
from ratelimit_app.apply.concurrency import slots_taken
from ratelimit_app.apply.limitcheck import LimitCheck
from ratelimit_app.apply.limiting import LimitOutcome, limit_request
from ratelimit_app.apply.outcome import ALLOWED
from ratelimit_app.apply.responses import refusal
from ratelimit_app.gateway.answers import BODY_HEADER, STATUS_HEADER, answer, under_contract
from ratelimit_app.gateway.describe import AUTH_REQUEST, AUTHORIZE
from ratelimit_app.gateway.lease import LEASE_HEADER, slots_of
from ratelimit_app.service.limiter import get_limiter
from tests.support.limits_support import make_key, make_tier

factory = RequestFactory()
TIGHT = (Policy("tight", "fixed_window", limit=1, period=60),)


def content(response: HttpResponseBase) -> bytes:
    assert isinstance(response, HttpResponse)
    return response.content


def limited(key: str) -> LimitOutcome:
    return limit_request(factory.get("/api/things", REMOTE_ADDR="203.0.113.9", HTTP_X_API_KEY=key))


@pytest.mark.django_db
def test_an_allowed_request_is_a_200_with_its_headers_and_an_empty_lease_header_when_it_took_no_slot() -> None:
    outcome = limited(make_key(make_tier("answered", [("minute", "fixed_window", 5, 60, None, "")])))
    response = answer(outcome, 1)
    assert response.status_code == 200 and content(response) == b""
    assert response[LEASE_HEADER] == ""  # present: a gateway copying it never copies a missing header
    assert response["X-RateLimit-Limit"] == "5" and response["X-RateLimit-Remaining"] == "4"


def test_the_lease_header_names_the_slots_the_request_took() -> None:
    slot = Policy("inflight", "concurrency", limit=2, period=30)
    token, checks = new_lease_token(), [("key:abcd1234", (slot,))]
    slots = slots_taken(checks, get_limiter().hit_many(checks, lease=token), token)
    outcome = LimitOutcome(ALLOWED, None, (), None, "key:abcd1234", slots=slots)
    named = slots_of(answer(outcome, 1)[LEASE_HEADER])
    assert (named.token, named.held, named.local) == (token, (("key:abcd1234", slot),), False)
    named.release()
    assert get_limiter().peek("key:abcd1234", (slot,)).remaining == 2


@pytest.mark.django_db
def test_a_refusal_is_the_middlewares_answer_and_nginx_gets_it_inside_a_403() -> None:
    key = make_key(make_tier("refused", [("minute", "fixed_window", 5, 60, None, "")]))
    extra = [LimitCheck("service:tight", TIGHT, "svc")]
    request = factory.get("/api/things", REMOTE_ADDR="203.0.113.9", HTTP_X_API_KEY=key)
    limit_request(request, extra=extra)
    outcome = limit_request(request, extra=extra)
    response = answer(outcome, 1)
    expected = refusal(outcome, 1)
    assert (response.status_code, content(response), response["Retry-After"]) == \
        (429, content(expected), expected["Retry-After"])
    assert under_contract(response, AUTHORIZE) is response  # Caddy, Traefik and Envoy pass it on as it is
    carried = under_contract(response, AUTH_REQUEST)
    assert carried.status_code == 403 and content(carried) == b""
    assert carried[STATUS_HEADER] == "429" and json.loads(carried[BODY_HEADER]) == json.loads(content(response))
    assert "\n" not in carried[BODY_HEADER]
    for name in ("Content-Type", "Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining"):
        assert carried[name] == response[name], name


def test_under_auth_request_a_200_passes_as_it_is_and_a_streamed_refusal_carries_no_body() -> None:
    allowed = HttpResponse(status=200)
    assert under_contract(allowed, AUTH_REQUEST) is allowed
    streamed = StreamingHttpResponse(iter([b"{}"]), status=503, content_type="application/json")
    carried = under_contract(streamed, AUTH_REQUEST)
    assert (carried.status_code, carried[STATUS_HEADER], carried[BODY_HEADER]) == (403, "503", "")
    assert carried["Content-Type"] == "application/json"
