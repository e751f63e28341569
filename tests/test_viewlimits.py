"""Limits counted by outcome (`@ratelimit(count_if=...)`): one reserved before the view, settled after it
to one when the response matches and to none when not; the failed-login scenario sequentially, under 8
concurrent clients and on an async view, counted exactly. Also the decorator's and the per-IP limit's
shadow mode."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import requests
from django.http import HttpRequest, JsonResponse
from django.test import AsyncClient, Client
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from project.urls import urlpatterns as demo_urlpatterns
from ratelimit_app import RateLimiter
from ratelimit_app.apply.routes import VIEW_LIMIT_ATTRIBUTE
from ratelimit_app.core.keys import state_entries
from ratelimit_app.decorators import ratelimit
from ratelimit_app.service.limiter import get_limiter
from tests.observability.test_prometheus import scrape, value
from tests.support.limits_support import make_key, parse_ietf, seed_tiers, set_ip_rate

LIMIT = 5


def failed(response: Any) -> bool:
    return response.status_code in (401, 403)


@csrf_exempt
@ratelimit(rate=f"{LIMIT}/15m", key="post:username", group="login", count_if=failed)
def login(request: HttpRequest) -> JsonResponse:
    if request.POST.get("password") == "right":
        return JsonResponse({"ok": True})
    return JsonResponse({"error": "wrong username or password"}, status=401)


@ratelimit(rate="2/h", key="ip", group="shadowed", shadow=True)
def shadowed(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@csrf_exempt
@ratelimit(rate=f"{LIMIT}/15m", key="post:username", group="alogin", count_if=failed)
async def alogin(request: HttpRequest) -> JsonResponse:
    await asyncio.sleep(0.05)  # in flight together: every request is admitted or refused while the others run
    if request.POST.get("password") == "boom":
        raise RuntimeError("the view failed")
    return JsonResponse({"error": "wrong username or password"}, status=401)


@csrf_exempt
@ratelimit(rate="2/15m", key="post:username", group="slogin", shadow=True, count_if=failed)
def slogin(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


urlpatterns = [*demo_urlpatterns, path("login", login), path("alogin", alogin), path("shadowed", shadowed),
               path("slogin", slogin)]


def used(username: str, group: str = "login") -> int:
    """Units charged to `username`'s counter, read from Redis."""
    limit = getattr({"alogin": alogin, "slogin": slogin}.get(group, login), VIEW_LIMIT_ATTRIBUTE)
    engine = get_limiter().limiter()
    assert isinstance(engine, RateLimiter)
    key = engine.keys(f"view:{group}|post:username:{username}", limit.policies)[0]
    value = engine.client.get(key)
    entries = state_entries(value) if isinstance(value, bytes) else {}
    return len(entries.get("s" + limit.policies[0].name, (0, b""))[1]) // 7  # the sliding log: 7 bytes a unit


@pytest.mark.urls(__name__)
def test_failed_logins_are_counted_and_successful_ones_are_free(client: Client) -> None:
    def attempt(password: str, username: str = "alice") -> int:
        return client.post("/login", {"username": username, "password": password}).status_code

    assert [attempt("wrong") for _ in range(3)] == [401] * 3
    assert [attempt("right") for _ in range(10)] == [200] * 10  # successes charge nothing
    assert [attempt("wrong") for _ in range(3)] == [401, 401, 429]
    assert used("alice") == LIMIT
    assert attempt("right") == 429  # at the limit, the check refuses before the view runs
    assert attempt("wrong", username="bob") == 401  # counted per username


@pytest.mark.urls(__name__)
@pytest.mark.django_db(transaction=True)
def test_eight_concurrent_clients_are_served_exactly_the_limit(live_server: Any) -> None:
    clients, attempts = 8, 4
    barrier = threading.Barrier(clients)
    statuses: list[int] = []
    lock = threading.Lock()

    def client() -> None:
        with requests.Session() as session:
            barrier.wait()
            for _ in range(attempts):
                status = session.post(f"{live_server.url}/login", data={"username": "carol", "password": "x"},
                                      timeout=30).status_code
                with lock:
                    statuses.append(status)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(statuses) == clients * attempts and set(statuses) <= {401, 429}
    # each request reserves one before the view, in flight or not: exactly the limit is served and counted
    assert statuses.count(401) == LIMIT
    assert used("carol") == LIMIT


@pytest.mark.urls(__name__)
def test_concurrent_requests_to_an_async_view_are_served_exactly_the_limit() -> None:
    async def attempts() -> list[int]:
        client = AsyncClient()
        responses = await asyncio.gather(*(client.post("/alogin", {"username": "dave", "password": "x"})
                                           for _ in range(3 * LIMIT)))
        return [response.status_code for response in responses]

    statuses = asyncio.run(attempts())
    assert sorted(statuses) == [401] * LIMIT + [429] * (2 * LIMIT)
    assert used("dave", "alogin") == LIMIT


@pytest.mark.urls(__name__)
def test_a_view_that_raises_leaves_nothing_counted(client: Client) -> None:
    with pytest.raises(RuntimeError):
        client.post("/alogin", {"username": "erin", "password": "boom"})
    assert used("erin", "alogin") == 0


@pytest.mark.urls(__name__)
def test_a_shadow_limit_counted_by_outcome_counts_only_what_matches(client: Client) -> None:
    assert [client.post("/slogin", {"username": "fay"}).status_code for _ in range(4)] == [200] * 4
    assert used("fay", "slogin") == 0  # no response matched: nothing counted


@pytest.mark.urls(__name__)
def test_a_shadow_decorator_limit_never_refuses_and_counts_would_be_refusals(client: Client) -> None:
    before = scrape(client)
    assert [client.get("/shadowed").status_code for _ in range(5)] == [200] * 5
    assert "RateLimit" not in client.get("/shadowed")  # a shadow limit never shows in the headers
    after = scrape(client)
    labels = {"tier": "decorator", "policy": "shadowed"}
    assert value(after, "ratelimit_shadow_blocked_total", **labels) - value(
        before, "ratelimit_shadow_blocked_total", **labels) == 4


@pytest.mark.django_db
def test_a_shadow_per_ip_limit_never_refuses(client: Client, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_SHADOW": True}
    seed_tiers()
    set_ip_rate("free", "2/m")
    key = make_key("free")
    before = scrape(client)
    responses = [client.get("/api/users", HTTP_X_API_KEY=key) for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert "ip" not in parse_ietf(responses[-1]["RateLimit-Policy"])
    after = scrape(client)
    labels = {"tier": "free", "policy": "ip"}
    assert value(after, "ratelimit_shadow_blocked_total", **labels) - value(
        before, "ratelimit_shadow_blocked_total", **labels) == 3


def test_the_label_of_an_identity_with_user_data_says_what_it_is_and_shows_a_digest() -> None:
    from ratelimit_app.viewlimits import digest_label

    header = digest_label("header:x-device-id:phone-of-alice")
    assert header.startswith("header:x-device-id:#") and len(header) == len("header:x-device-id:#") + 12
    assert digest_label("post:username:alice").startswith("post:username:#")
    assert digest_label("tenant-42").startswith("custom:#")
    assert "alice" not in header + digest_label("post:username:alice")
