"""The limiter under ASGI, in process: Django's ASGI handler (django.test.AsyncClient) serving the demo
site over real Redis and the database.

Under ASGI RateLimitMiddleware is a coroutine and decides on the event loop: the thread hops a
request makes are counted (every `sync_to_async` call goes through `SyncToAsync.__call__`) and
compared with the same request when the limiter is off, and the thread the request is planned in is
recorded, next to a sync-only build of the same middleware, which Django runs in a thread.

The hung-Redis test stops a redis-server it starts itself (SIGSTOP), never the shared Redis.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from django.contrib.auth import get_user_model
from django.db import connections
from django.http import HttpRequest
from django.test import AsyncClient

from devtools.embedded import RedisProcess
from ratelimit_app.apply.admission import state_of
from ratelimit_app.middleware import RateLimitMiddleware, _leave
from ratelimit_app.service.limiter_async import get_async_limiter
from tests.service.test_limiter_async import assert_answered_within_the_budget, ticker
from tests.support.limits_support import make_key, parse_ietf, record_planning_threads, seed_tiers, set_ip_rate

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")
MIDDLEWARE_PATH = "ratelimit_app.middleware.RateLimitMiddleware"


class SyncOnlyRateLimitMiddleware(RateLimitMiddleware):
    """The same middleware declared sync-only: what every Django rate limiter is today under ASGI."""

    async_capable = False


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run `scenario()` in a new event loop, then close the Redis client made for that loop."""
    async def main() -> T:
        try:
            return await scenario()
        finally:
            await get_async_limiter().aclose()
            # the database connection the thread of sync_to_async opened (the test client keeps Django
            # from closing it at the end of each request)
            await sync_to_async(connections.close_all)()

    return asyncio.run(main())


@pytest.fixture
def free_key() -> str:
    seed_tiers()  # transactional tests flush tables: restore what the data migration seeds
    return make_key("free")


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[Callable[..., Any]]:
    """The functions run by `sync_to_async` (each one a thread hop) from here on, in order."""
    hopped: list[Callable[..., Any]] = []
    original = SyncToAsync.__call__

    async def counting(self: SyncToAsync[Any, Any], *args: Any, **kwargs: Any) -> Any:
        hopped.append(inspect.unwrap(self.func))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counting)
    return hopped


@pytest.fixture
def planned_in(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The threads in which requests were planned (see `record_planning_threads`)."""
    return record_planning_threads(monkeypatch)


def test_an_async_view_under_asgi_admits_ten_then_answers_429_with_headers(free_key: str) -> None:
    async def scenario() -> tuple[Any, list[Any]]:
        client = AsyncClient()
        anonymous = await client.get("/api/async/users")
        limited = [await client.get("/api/async/users", headers={"X-API-Key": free_key}) for _ in range(11)]
        return anonymous, limited

    anonymous, responses = run(scenario)
    assert anonymous.status_code == 401 and anonymous.json() == {"error": "API key required"}
    assert [r.status_code for r in responses] == [200] * 10 + [429]
    assert [int(r.headers["X-RateLimit-Remaining"]) for r in responses[:10]] == list(range(9, -1, -1))
    denied = responses[-1]
    assert denied.json()["policy"] == "burst" and int(denied.headers["Retry-After"]) >= 1
    assert denied.headers["X-RateLimit-Tier"] == "free"
    assert parse_ietf(denied.headers["RateLimit"])["minute"]["r"] == 10  # the refused request charged nothing


def test_status_calls_under_asgi_count_against_the_per_ip_limit(settings: Any, free_key: str) -> None:
    set_ip_rate("free", "3/m")

    async def scenario() -> list[Any]:
        client = AsyncClient()
        return [await client.get("/api/rate-limit/status", headers={"X-API-Key": free_key}) for _ in range(5)]

    responses = run(scenario)
    assert [r.status_code for r in responses] == [200] * 3 + [429] * 2
    assert [r.json()["limits"][0]["remaining"] for r in responses[:3]] == [2, 1, 0]
    assert responses[-1].json()["policy"] == "ip"


def test_a_warm_limited_request_makes_no_thread_hop_of_its_own(
        settings: Any, free_key: str, hops: list[Callable[..., Any]], planned_in: list[int]) -> None:
    """A warm request to an `async def` view makes as many thread hops with the limiter deciding it as
    with the limiter off (Django's own middleware hops, either way), and the limiter plans it on the
    event loop's thread; the sync-only build of the same middleware is run in a thread by Django."""
    def warm_request(path: str) -> tuple[int, list[int], int]:
        """(thread hops, threads the request was planned in, status) of the second of two requests."""
        async def scenario() -> tuple[int, list[int], int]:
            client, headers = AsyncClient(), {"X-API-Key": free_key}
            await client.get(path, headers=headers)  # warm: the key and tier cached in process, Redis connected
            hopped, planned = len(hops), len(planned_in)
            response = await client.get(path, headers=headers)
            return len(hops) - hopped, planned_in[planned:], response.status_code

        return run(scenario)

    loop_thread = threading.get_ident()  # asyncio.run runs the loop in this thread
    limited, limited_planned, status = warm_request("/api/async/users")
    assert status == 200 and limited_planned == [loop_thread]
    settings.RATELIMIT = {**settings.RATELIMIT, "ENABLED": False}
    baseline, baseline_planned, _ = warm_request("/api/async/users")
    assert baseline_planned == []
    settings.RATELIMIT = {**settings.RATELIMIT, "ENABLED": True}
    decorated, _, status = warm_request("/public/async-quote")  # @ratelimit on an async def view
    assert status == 200
    assert limited == baseline and decorated == baseline
    settings.MIDDLEWARE = [f"{__name__}.SyncOnlyRateLimitMiddleware" if name == MIDDLEWARE_PATH else name
                           for name in settings.MIDDLEWARE]
    _, sync_planned, status = warm_request("/api/async/users")
    assert status == 200 and len(sync_planned) == 1 and sync_planned[0] != loop_thread


def test_a_session_user_is_limited_as_the_user_from_any_address(settings: Any, free_key: str) -> None:
    """The session is read without blocking the loop (request.auser() / one sync_to_async call), and
    the user's limits apply whatever the client's address."""
    settings.RATELIMIT = {**settings.RATELIMIT, "DEFAULT_USER_TIER": "free"}
    user = get_user_model().objects.create_user("ada", password="x")
    client = AsyncClient()
    client.force_login(user)

    async def scenario() -> list[Any]:
        return [await client.get("/api/async/users", REMOTE_ADDR=f"10.0.0.{n % 3 + 1}") for n in range(11)]

    responses = run(scenario)
    assert [r.status_code for r in responses] == [200] * 10 + [429]
    assert responses[0].headers["X-RateLimit-Tier"] == "free"


def test_ratelimit_on_an_async_view_limits_it(free_key: str) -> None:
    async def scenario() -> list[Any]:
        client = AsyncClient()
        return [await client.get("/public/async-quote") for _ in range(6)]

    responses = run(scenario)
    assert [r.status_code for r in responses] == [200] * 5 + [429]
    assert responses[-1].json()["policy"] == "async-quote" and responses[0].headers["X-RateLimit-Limit"] == "5"




@pytest.mark.parametrize(("mode", "status"), [("open", 200), ("closed", 503)])
def test_a_hung_redis_under_asgi_is_answered_within_the_budget_and_the_loop_keeps_serving(
        settings: Any, server: RedisProcess, free_key: str, mode: str, status: int,
        caplog: pytest.LogCaptureFixture) -> None:
    """SIGSTOP the limiter's Redis: 8 concurrent requests each answer as the fail mode says within the
    budget (see assert_answered_within_the_budget), and a ticker coroutine keeps waking up meanwhile (a
    blocking call would hold the loop for a whole budget).

    Django logs every 5xx response on "django.request" at ERROR, where its default AdminEmailHandler
    builds a full error report even with no ADMINS (Django 4.2: tens of milliseconds of CPU per 503,
    in threads that take the GIL from the loop). That is Django's cost, not the limiter's: it is off
    here, as it is in production sites that configure their own logging."""
    caplog.set_level(logging.CRITICAL, logger="django.request")
    budget_ms = 300
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url, "FAIL_MODE": mode,
                          "BUDGET_MS": budget_ms, "BREAKER_FAILURES": 1000}

    async def scenario() -> tuple[list[tuple[int, float]], list[float]]:
        client, headers = AsyncClient(), {"X-API-Key": free_key}
        assert (await client.get("/api/async/users", headers=headers)).status_code == 200  # warm: cached, connected
        gc.collect()  # late in a long test run a full collection can pause the process; not inside the timing
        server.process.send_signal(signal.SIGSTOP)
        stop, lags = asyncio.Event(), list[float]()
        ticking = asyncio.create_task(ticker(stop, lags))

        async def one_request() -> tuple[int, float]:
            started = time.perf_counter()
            response = await client.get("/api/async/users", headers=headers)
            return response.status_code, time.perf_counter() - started

        results = await asyncio.gather(*(one_request() for _ in range(8)))
        stop.set()
        await ticking
        return list(results), lags

    results, lags = run(scenario)
    assert [answered for answered, _ in results] == [status] * 8
    assert_answered_within_the_budget([duration for _, duration in results], lags, budget_ms)
    assert min(duration for _, duration in results) >= budget_ms / 1000 * 0.9  # they did wait on Redis


def test_a_request_cancelled_twice_runs_its_closers_in_the_releasing_thread_not_on_the_loop() -> None:
    """`_leave` is a callback on the event loop: a closer (a usage settlement makes a blocking Redis call)
    is handed to the releasing thread, like the request's slots."""
    request = HttpRequest()
    ran_in, done = list[str](), threading.Event()

    def closer() -> None:
        ran_in.append(threading.current_thread().name)
        done.set()

    state_of(request).at_end(closer)
    _leave(request)
    assert done.wait(timeout=10) and ran_in == ["ratelimit-slot-releaser"]
    assert state_of(request).take_closers() == []  # taken: not run again when the request ends
