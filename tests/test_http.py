"""The demo API over real HTTP (a live server thread, `requests`), with the seeded free tier and real Redis."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests

from tests.support.limits_support import check_free_burst, make_key, parse_ietf, race_of_eight_clients, seed_tiers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def free_key(live_server: Any) -> str:
    seed_tiers()  # transactional tests flush tables: restore what the data migration seeds
    return make_key("free")


def remaining_of(base: str, key: str) -> dict[str, int]:
    """What the status endpoint reports as remaining in each limit (it consumes nothing of the tier,
    and one unit of the per-IP limit)."""
    response = requests.get(f"{base}/api/rate-limit/status", headers={"X-API-Key": key}, timeout=10)
    assert response.status_code == 200 and response.json()["tier"] == "free"
    return {limit["name"]: limit["remaining"] for limit in response.json()["limits"]}


@pytest.mark.slow
def test_seed_scenario(live_server: Any, free_key: str) -> None:
    base = live_server.url
    session = requests.Session()
    session.headers["X-API-Key"] = free_key

    # Without a key: 401 with a JSON reason.
    anonymous = requests.get(f"{base}/api/users", timeout=10)
    assert anonymous.status_code == 401 and anonymous.json() == {"error": "API key required"}

    # The status endpoint consumes nothing of the tier, and one unit of the per-IP limit (the free tier's
    # own: the 401 was counted on the address' default, IP_RATE).
    first, second = remaining_of(base, free_key), remaining_of(base, free_key)
    assert first == {"ip": 99, "burst": 10, "minute": 20, "day": 1000}
    assert second == first | {"ip": 98}

    # 10 rapid requests pass (the bucket holds 10); the 11th is 429.
    responses = [session.get(f"{base}/api/users", timeout=10) for _ in range(11)]
    live = check_free_burst(responses)
    assert live["ip"]["r"] == 88
    for response in responses:
        assert parse_ietf(response.headers["RateLimit-Policy"]) == {
            "ip": {"q": 100, "w": 60}, "burst": {"q": 10, "w": 30}, "minute": {"q": 20, "w": 60},
            "day": {"q": 1000, "w": 86400}}
    body = responses[-1].json()

    # As the bucket refills (one token per 3 s, waiting what the limiter says), requests pass again,
    # until the 20/min sliding window is full: 20 admitted in the minute, then "minute" refuses.
    admitted, wait = 10, body["retry_after"]
    for _ in range(40):  # bounded: one 200 and at most one 429 per token
        if admitted == 20:
            break
        time.sleep(wait)
        response = session.get(f"{base}/api/users", timeout=10)
        if response.status_code == 200:
            admitted, wait = admitted + 1, 0.0  # try again at once: a 429 says how long to wait
        else:
            assert response.status_code == 429 and response.json()["policy"] == "burst"
            wait = response.json()["retry_after"]
    assert admitted == 20
    # Once the bucket holds a token again (polled on the status endpoint, which consumes nothing of the
    # tier), the bucket would allow the next request, and the per-minute window alone refuses it.
    deadline = time.monotonic() + 10
    while remaining_of(base, free_key)["burst"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    standing = remaining_of(base, free_key)
    assert standing["minute"] == 0 and standing["burst"] >= 1 and standing["day"] == 980
    blocked = session.get(f"{base}/api/users", timeout=10)
    assert blocked.status_code == 429 and blocked.json()["policy"] == "minute"
    assert parse_ietf(blocked.headers["RateLimit"])["burst"]["r"] >= 1
    # The window frees its first slot when the first request is a minute old.
    assert 0 < blocked.json()["retry_after"] <= 60


def test_health_is_never_limited(live_server: Any, free_key: str) -> None:
    base = live_server.url
    session = requests.Session()
    responses = [session.get(f"{base}/health", timeout=10) for _ in range(120)]  # more than the IP's 100/min
    assert all(r.status_code == 200 and r.json() == {"status": "ok", "redis": "up"} for r in responses)
    assert not any("X-RateLimit-Limit" in r.headers or "RateLimit" in r.headers for r in responses)
    # none of it counted against the per-IP limit
    response = session.get(f"{base}/api/users", headers={"X-API-Key": free_key}, timeout=10)
    assert response.status_code == 200 and parse_ietf(response.headers["RateLimit"])["ip"]["r"] == 99


def test_concurrent_burst_from_eight_clients_admits_exactly_ten(live_server: Any, free_key: str) -> None:
    base = live_server.url
    remaining_of(base, free_key)  # look the key up once (costs nothing), so the burst races only on Redis
    statuses, _ = race_of_eight_clients(base, "/api/users", free_key)
    assert len(statuses) == 50
    assert statuses.count(200) == 10 and statuses.count(429) == 40
    assert remaining_of(base, free_key)["minute"] == 10  # denied requests consumed nothing


def test_post_data_costs_five_over_http(live_server: Any, free_key: str) -> None:
    base = live_server.url
    response = requests.post(f"{base}/api/data", json={"a": 1}, headers={"Authorization": f"Bearer {free_key}"},
                             timeout=10)
    assert response.status_code == 201 and response.json()["keys"] == ["a"]
    assert response.headers["X-RateLimit-Remaining"] == "5"  # the bucket of 10, minus 5
    assert remaining_of(base, free_key)["minute"] == 15
    bad = requests.post(f"{base}/api/data", data=b"{not json", headers={"X-API-Key": free_key}, timeout=10)
    assert bad.status_code == 400 and bad.json() == {"error": "the body must be JSON"}
