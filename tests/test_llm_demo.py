"""The demo's usage-limited endpoint, POST /api/llm/chat, through Django's test client against real Redis:
the pro tier's 2,000 tokens a minute, each request reserving its max_tokens and settled at what it used."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from tests.support.limits_support import make_key, seed_tiers

pytestmark = pytest.mark.django_db


def chat(client: Client, key: str, max_tokens: Any, use: Any) -> Any:
    response = client.post("/api/llm/chat", json.dumps({"max_tokens": max_tokens, "use": use}),
                           content_type="application/json", HTTP_X_API_KEY=key)
    if response.streaming:
        b"".join(response.streaming_content)  # type: ignore[attr-defined]
        response.close()  # as a server does once the stream is sent: the settlement runs here
    return response


def test_thirty_requests_of_500_using_100_admit_exactly_16(client: Client) -> None:
    seed_tiers()
    key = make_key("pro")
    statuses = [chat(client, key, 500, 100).status_code for _ in range(30)]
    assert statuses.count(200) == 16 and statuses[:16] == [200] * 16
    refusal = chat(client, key, 500, 100)
    assert refusal.status_code == 429
    body = refusal.json()
    assert "tokens" in json.dumps(body)


def test_a_bad_body_is_a_400_naming_the_field(client: Client) -> None:
    seed_tiers()
    key = make_key("pro")
    response = chat(client, key, "lots", 1)
    assert response.status_code == 400 and "max_tokens" in response.json()["detail"]
    assert chat(client, key, 0, 0).status_code == 400
    assert chat(client, key, 10, 10).status_code == 200


def test_other_routes_do_not_charge_tokens(client: Client) -> None:
    seed_tiers()
    key = make_key("pro")
    for _ in range(3):
        assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200
    status = client.get("/api/rate-limit/status", HTTP_X_API_KEY=key).json()
    tokens = [limit for limit in status["limits"] if limit["name"] == "llm.tokens"]
    assert tokens and tokens[0]["remaining"] == 2000 and tokens[0]["unit"] == "tokens"


def test_headers_and_refusal_name_the_token_policy_and_its_unit(client: Client, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "USAGE_HEADERS": True}
    seed_tiers()
    key = make_key("pro")
    response = chat(client, key, 1500, 5)
    assert response.status_code == 200
    assert '"llm.tokens";q=2000;w=60;qu="tokens"' in response["RateLimit-Policy"]
    assert '"llm.tokens";r=500;' in response["RateLimit"]  # the estimate, reserved
    assert response["x-ratelimit-limit-tokens"] == "2000" and response["x-ratelimit-remaining-tokens"] == "500"
    assert response["x-ratelimit-reset-tokens"].endswith("s")
    status = client.get("/api/rate-limit/status", HTTP_X_API_KEY=key).json()
    assert [row["remaining"] for row in status["limits"] if row["name"] == "llm.tokens"] == [1995]  # settled at 5
    refusal = chat(client, key, 2000, 1)
    assert refusal.status_code == 429
    body = refusal.json()
    assert (body["policy"], body["unit"], body["error"]) == ("llm.tokens", "tokens", "tokens limit exceeded")
    assert 55 < body["retry_after"] <= 60  # when the 5 tokens used leave the window
    never = chat(client, key, 4000, 1)
    assert never.status_code == 429 and never.json()["retry_after"] is None and "tokens" in never.json()["error"]
    # out of tokens is not out of requests: the key's other routes are still answered
    assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200
    assert chat(client, key, 100, 1).status_code == 200  # and a smaller estimate still fits


def test_a_client_that_stops_reading_is_charged_what_it_was_sent(client: Client) -> None:
    seed_tiers()
    key = make_key("pro")
    response = client.post("/api/llm/chat", json.dumps({"max_tokens": 1000, "use": 1000}),
                           content_type="application/json", HTTP_X_API_KEY=key)
    stream = iter(response.streaming_content)  # type: ignore[attr-defined]
    for _ in range(30):
        next(stream)
    response.close()  # the server closes the response of a client that went away
    status = client.get("/api/rate-limit/status", HTTP_X_API_KEY=key).json()
    assert [row["remaining"] for row in status["limits"] if row["name"] == "llm.tokens"] == [1970]
