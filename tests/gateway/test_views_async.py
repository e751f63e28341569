"""ratelimit_app.gateway.views_async, the async twins of the gateway endpoint's views
(ratelimit_app.gateway.async_urls), under Django's ASGI handler (AsyncClient) against the real Redis: the
same answers as the sync views, the decision made on the event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.test import AsyncClient
from django.urls import include, path

from project.urls import urlpatterns as demo_urlpatterns
from ratelimit_app.gateway import views_async
from tests.gateway.test_views import CLIENT, Answer, lease_ends_in_ms, tokens_key
from tests.support.limits_support import (
    add_slots,
    check_free_burst,
    make_key,
    record_planning_threads,
    seed_tiers,
)
from tests.test_asgi import run

#: The async twins serve /ratelimit/ before the demo's sync views (@pytest.mark.urls(__name__)).
urlpatterns = [path("ratelimit/", include("ratelimit_app.gateway.async_urls")), *demo_urlpatterns]


@pytest.fixture(autouse=True)
def _behind_one_gateway(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "TRUSTED_PROXIES": 1}


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_under_asgi_the_async_twins_decide_on_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    seed_tiers()  # transactional tests flush tables: restore what the data migration seeds
    key = make_key("free")
    planned_in = record_planning_threads(monkeypatch)

    async def scenario() -> tuple[list[Answer], Answer, Answer]:
        client = AsyncClient()
        sent = {"X-API-Key": key, "X-Forwarded-For": CLIENT}
        answers = []
        for _ in range(11):
            answer = Answer(await client.get("/ratelimit/authorize", headers={
                **sent, "X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/orders/7"}))
            answers.append(answer)
            if answer.status_code == 200:  # the slot of the free tier goes back through the async service
                lease = {"X-RateLimit-Lease": answer.headers["X-RateLimit-Lease"]}
                assert (await client.post("/ratelimit/release", headers=lease)).status_code == 204
        nginx = Answer(await client.get("/ratelimit/auth-request", headers={
            **sent, "X-Original-Method": "GET", "X-Original-URI": "/orders/7"}))
        envoy = Answer(await client.post("/ratelimit/authorize/orders/7", headers=sent))  # no CSRF token
        return answers, nginx, envoy

    answers, nginx, envoy = run(scenario)
    check_free_burst(answers)
    assert (nginx.status_code, nginx.headers["X-RateLimit-Status"]) == (403, "429")
    assert envoy.status_code == 429 and envoy.json()["policy"] == "burst"
    assert all(asyncio.iscoroutinefunction(view) for view in (views_async.authorize, views_async.auth_request,
                                                               views_async.release))
    # the first request's plan needed the database: it was made again in a thread (sync_to_async); the
    # 12 later requests were planned on the event loop, in the thread asyncio.run runs it in
    loop_thread = threading.get_ident()
    assert planned_in[1] != loop_thread and planned_in[2:] == [loop_thread] * 12


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_the_async_twins_hold_the_first_lease_and_confirm_it(settings: Any, redis_client: Any, key_prefix: str) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "GATEWAY_FIRST_LEASE": 0.1}
    seed_tiers()
    add_slots("free", 2)
    key = make_key("free")
    sent = {"X-API-Key": key, "X-Forwarded-For": CLIENT, "X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/orders/7"}

    async def scenario() -> tuple[list[Answer], float, int, int, int]:
        client = AsyncClient()
        gone = Answer(await client.get("/ratelimit/authorize", headers=sent))
        while lease_ends_in_ms(redis_client, key_prefix, gone) > 0:
            pass  # Redis' clock, read until its first lease of 0.1 s has ended
        settings.RATELIMIT = {**settings.RATELIMIT, "GATEWAY_FIRST_LEASE": 5}
        kept = Answer(await client.get("/ratelimit/authorize", headers=sent))
        first = lease_ends_in_ms(redis_client, key_prefix, kept)
        confirmed = (await client.post("/ratelimit/confirm", headers=_lease(kept))).status_code
        late = (await client.post("/ratelimit/confirm", headers=_lease(gone))).status_code
        released = (await client.post("/ratelimit/release", headers=_lease(kept))).status_code
        return [gone, kept], first, confirmed, late, released

    answers, first, confirmed, late, released = run(scenario)
    assert [answer.status_code for answer in answers] == [200, 200]
    assert 4000 < first <= 5000 and (confirmed, late, released) == (204, 409, 204)
    assert asyncio.iscoroutinefunction(views_async.confirm)


def _lease(answer: Answer) -> dict[str, str]:
    return {"X-RateLimit-Lease": answer.headers["X-RateLimit-Lease"]}


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_the_async_twins_reserve_an_estimate_and_settle_it_with_the_release() -> None:
    key = tokens_key("gwasynctokens")
    sent = {"X-API-Key": key, "X-Forwarded-For": CLIENT, "X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/chat",
            "X-RateLimit-Usage": "tokens=500"}

    async def scenario() -> list[int]:
        client = AsyncClient()
        statuses = []
        for _ in range(10):
            answer = Answer(await client.get("/ratelimit/authorize", headers=sent))
            statuses.append(answer.status_code)
            if answer.status_code == 200:
                used = {"X-RateLimit-Lease": answer.headers["X-RateLimit-Lease"], "X-RateLimit-Usage": "tokens=100"}
                assert (await client.post("/ratelimit/release", headers=used)).status_code == 204
        return statuses

    # 6 admitted: 5 x 100 used and 500 reserved fit in 1,000, a 7th would need 500 more than the 400 left
    assert run(scenario) == [200] * 6 + [429] * 4
