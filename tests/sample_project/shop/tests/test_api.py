"""The API under the middleware: the free tier's burst, costs, concurrency slots, and switching limits off."""

from __future__ import annotations

import pytest

from ratelimit_app.testing import assert_limited, assert_not_limited, make_api_key

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("run", range(3))
def test_a_free_key_gets_a_burst_of_ten_then_waits_three_seconds(client, ratelimit, run):
    """Run three times, in any order and on any worker: each run starts from fresh counters."""
    key = make_api_key("free")
    for _ in range(10):
        assert_not_limited(client.get("/api/products", HTTP_X_API_KEY=key))
    refused = client.get("/api/products", HTTP_X_API_KEY=key)
    assert_limited(refused, policy="burst")
    assert refused["Retry-After"] == "3"  # the bucket refills 20 a minute
    ratelimit.advance(3)
    assert_not_limited(client.get("/api/products", HTTP_X_API_KEY=key))


def test_the_same_client_address_starts_afresh_in_every_test(client, ratelimit):
    # no key: served, and charged to the per-IP limit (100 a minute)
    answers = [client.get("/api/products") for _ in range(100)]
    assert {response.status_code for response in answers} == {200}
    assert_limited(client.get("/api/products"), policy="ip")


def test_an_order_costs_five(client, ratelimit):
    key = make_api_key("free")
    assert client.post("/api/orders", HTTP_X_API_KEY=key).status_code == 201
    assert client.post("/api/orders", HTTP_X_API_KEY=key).status_code == 201
    assert_limited(client.post("/api/orders", HTTP_X_API_KEY=key), policy="burst")


def test_a_free_key_holds_two_downloads_at_once(client, ratelimit):
    key = make_api_key("free")
    downloads = [client.get("/api/export", HTTP_X_API_KEY=key) for _ in range(2)]
    assert_limited(client.get("/api/export", HTTP_X_API_KEY=key), policy="downloads")
    downloads[0].close()  # the first download is done: its slot is free again
    assert_not_limited(client.get("/api/products", HTTP_X_API_KEY=key))
    ratelimit.advance(60)  # a worker that died holding a slot: the slot's lease (60 s) runs out
    assert_not_limited(client.get("/api/export", HTTP_X_API_KEY=key))


def test_limits_can_be_switched_off_for_a_test(client, ratelimit):
    key = make_api_key("free")
    ratelimit.disable()
    for _ in range(30):
        assert_not_limited(client.get("/api/products", HTTP_X_API_KEY=key))
    ratelimit.enable()
    for _ in range(10):
        assert_not_limited(client.get("/api/products", HTTP_X_API_KEY=key))
    assert_limited(client.get("/api/products", HTTP_X_API_KEY=key))


def test_enabled_false_in_the_settings_switches_them_off_too(client, settings, ratelimit):
    settings.RATELIMIT = {**settings.RATELIMIT, "ENABLED": False}
    for _ in range(150):
        assert_not_limited(client.get("/api/products"))  # not even the per-IP limit: nothing is limited
    assert client.get("/api/products").status_code == 200


def test_reset_forgets_what_the_test_used(client, ratelimit):
    key = make_api_key("free")
    for _ in range(10):
        client.get("/api/products", HTTP_X_API_KEY=key)
    assert_limited(client.get("/api/products", HTTP_X_API_KEY=key))
    ratelimit.reset()
    assert_not_limited(client.get("/api/products", HTTP_X_API_KEY=key))
