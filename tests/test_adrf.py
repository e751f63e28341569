"""Our DRF throttles in adrf's async views (adrf.views.APIView with `async def` handlers), and in a plain
DRF view under Django's async handler, driven through Django's AsyncClient on the real Redis.

adrf runs a view's `initial()` (authentication, permissions, throttles) in `sync_to_async`: our sync
`allow_request` runs in a worker thread, never on the event loop (an async `allow_request` would be
bridged back to the loop with `async_to_sync`). Each request here runs in its own
`ThreadSensitiveContext`, as under Django's ASGIHandler, so concurrent requests decide in threads of
their own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import Any, ClassVar
from urllib.parse import urlsplit

import pytest
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import connections
from django.test import AsyncClient
from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.core.policies import CONCURRENCY, Policy
from ratelimit_app.decorators import usage
from ratelimit_app.models import TierLimit
from ratelimit_app.service.limiter import get_limiter
from ratelimit_app.throttling import (
    AnonRateThrottle,
    ConcurrencyThrottle,
    RateLimitHeadersMixin,
    ScopedRateThrottle,
    TierRateThrottle,
)
from tests.support.limits_support import make_key, make_tier, parse_ietf, poll
from tests.support.tcp_proxy import tcp_proxy

adrf_views = pytest.importorskip("adrf.views")  # adrf installs wherever the suite runs (requirements-test.txt)

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db(transaction=True)]


class AsyncOk(adrf_views.APIView):  # type: ignore[name-defined]
    async def get(self, request: Request) -> Response:
        return Response({"ok": True})


class WhereThrottled(TierRateThrottle):
    """Records the thread each decision runs in (its ident, and its name: unique per executor)."""

    threads: ClassVar[list[tuple[int, str]]] = []

    def allow_request(self, request: Request, view: Any) -> bool:
        self.threads.append((threading.get_ident(), threading.current_thread().name))
        return super().allow_request(request, view)


class TierView(RateLimitHeadersMixin, AsyncOk):
    throttle_classes = [WhereThrottled]


class ThreeAnon(AnonRateThrottle):
    THROTTLE_RATES = {"anon": "3/hour"}


class AnonView(RateLimitHeadersMixin, AsyncOk):
    throttle_classes = [ThreeAnon]


class TwoPerScope(ScopedRateThrottle):
    THROTTLE_RATES = {"reports": "2/hour"}


class ScopedTierView(RateLimitHeadersMixin, AsyncOk):
    throttle_classes = [TierRateThrottle, TwoPerScope]
    throttle_scope = "reports"


class TwoSlots(ConcurrencyThrottle):
    slots = 2
    scope = "adrf-slots"


class SlowView(RateLimitHeadersMixin, adrf_views.APIView):  # type: ignore[name-defined]
    throttle_classes = [TwoSlots]
    release: ClassVar[asyncio.Event]  # made on the test's event loop

    async def get(self, request: Request) -> Response:
        await self.release.wait()  # holds its slot until the test lets it go
        return Response({"ok": True})


class OneSlot(ConcurrencyThrottle):
    slots = 1
    scope = "adrf-one-slot"


class Broken(RuntimeError):
    """What an async view raises that DRF does not answer."""


class BrokenView(RateLimitHeadersMixin, adrf_views.APIView):  # type: ignore[name-defined]
    throttle_classes = [OneSlot]

    async def get(self, request: Request) -> Response:
        raise Broken("the view failed")


@usage(tokens=lambda request: 500)
class BrokenChat(RateLimitHeadersMixin, adrf_views.APIView):  # type: ignore[name-defined]
    throttle_classes = [TierRateThrottle]

    async def get(self, request: Request) -> Response:
        request.ratelimit.report_usage("tokens", 100)  # type: ignore[attr-defined]
        raise Broken("the view failed after using 100 tokens")


class SyncTierView(RateLimitHeadersMixin, APIView):
    """A plain DRF view, which Django runs in sync_to_async under ASGI."""

    throttle_classes = [TierRateThrottle]

    def get(self, request: Request) -> Response:
        return Response({"ok": True})


urlpatterns = [
    path("drf/tier", SyncTierView.as_view()),
    path("adrf/tier", TierView.as_view()),
    path("api/adrf/tier", TierView.as_view()),  # under RateLimitMiddleware (async under ASGI) too
    path("adrf/anon", AnonView.as_view()),
    path("adrf/reports", ScopedTierView.as_view()),
    path("adrf/slow", SlowView.as_view()),
    path("adrf/broken", BrokenView.as_view()),
    path("adrf/broken-chat", BrokenChat.as_view()),
]


async def get(path: str, key: str | None = None) -> Any:
    """One GET through the AsyncClient, in a thread-sensitive context of its own (as ASGIHandler does)."""
    headers = {"X-API-Key": key} if key else {}
    async with ThreadSensitiveContext():
        try:
            return await AsyncClient().get(path, headers=headers)
        finally:  # the request thread's database connection, which would outlive the test otherwise
            await sync_to_async(connections.close_all)()


def run(*calls: Awaitable[Any]) -> list[Any]:
    """Run the calls concurrently on one event loop; their results in order."""
    async def main() -> list[Any]:
        return list(await asyncio.gather(*calls))

    return asyncio.run(main())


@pytest.fixture
def three_key() -> str:
    """A key whose tier allows 3 requests an hour (an exact sliding log)."""
    tier = make_tier("three", [("hour", "sliding_window", 3, 3600, None, "")])
    return make_key(tier)


def test_the_view_is_async_and_the_tier_admits_exactly_three(three_key: str) -> None:
    assert TierView.view_is_async
    responses = [run(get("/adrf/tier", three_key))[0] for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["2", "1", "0", "0"]
    denied = responses[-1]
    assert "throttled" in denied.json()["detail"] and 1 <= int(denied["Retry-After"]) <= 3600
    assert denied["X-RateLimit-Tier"] == "three" and parse_ietf(denied["RateLimit"])["hour"]["r"] == 0


def test_under_the_middleware_the_throttle_decides_once(three_key: str) -> None:
    responses = [run(get("/api/adrf/tier", three_key))[0] for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["2", "1", "0", "0"]  # charged once each


def test_a_plain_drf_view_under_the_async_handler_admits_exactly_three(three_key: str) -> None:
    assert not SyncTierView.view_is_async
    responses = [run(get("/drf/tier", three_key))[0] for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert [r["X-RateLimit-Remaining"] for r in responses] == ["2", "1", "0", "0"]
    statuses = [r.status_code for r in run(*(get("/drf/tier", three_key) for _ in range(10)))]
    assert statuses == [429] * 10


def test_a_bad_key_is_401_in_an_async_view() -> None:
    missing, malformed = run(get("/adrf/tier"), get("/adrf/tier", "x" * 500))
    assert missing.status_code == 401 and missing.json() == {"detail": "API key required"}
    assert malformed.status_code == 401 and malformed.json() == {"detail": "malformed API key"}


def test_adrf_runs_our_throttles_in_a_worker_thread_not_on_the_event_loop(three_key: str) -> None:
    WhereThrottled.threads.clear()

    async def main() -> int:
        loop_thread = threading.get_ident()
        await get("/adrf/tier", three_key)
        return loop_thread

    loop_thread = asyncio.run(main())
    assert len(WhereThrottled.threads) == 1 and WhereThrottled.threads[0][0] != loop_thread


def test_twenty_concurrent_requests_admit_exactly_the_tier_limit(three_key: str) -> None:
    WhereThrottled.threads.clear()
    statuses = [r.status_code for r in run(*(get("/adrf/tier", three_key) for _ in range(20)))]
    assert statuses.count(200) == 3 and statuses.count(429) == 17
    assert len({name for _, name in WhereThrottled.threads}) == 20  # each decided in a thread of its own


def test_the_anon_drop_in_is_exact_under_concurrency() -> None:
    statuses = [r.status_code for r in run(*(get("/adrf/anon") for _ in range(20)))]
    assert statuses.count(200) == 3 and statuses.count(429) == 17
    denied = run(get("/adrf/anon"))[0]
    assert denied.status_code == 429 and 1 <= int(denied["Retry-After"]) <= 3600


def test_tier_and_scoped_throttles_decide_in_one_all_or_nothing_call(three_key: str) -> None:
    responses = [run(get("/adrf/reports", three_key))[0] for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]  # the scope's 2/hour refuses the third
    assert "reports" in parse_ietf(responses[-1]["RateLimit-Policy"])
    # the refused request charged nothing: the tier still has 1 of its 3 left
    assert run(get("/adrf/tier", three_key))[0]["X-RateLimit-Remaining"] == "0"


def test_concurrency_slots_are_held_by_async_views_and_given_back() -> None:
    async def main() -> list[int]:
        SlowView.release = asyncio.Event()
        tasks = [asyncio.ensure_future(get("/adrf/slow")) for _ in range(5)]
        done, pending = await asyncio.wait(tasks, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        while len(done) < 3 and pending:  # the refused answer at once; the admitted wait for `release`
            more, pending = await asyncio.wait(pending, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            done |= more
        refused = sorted(task.result().status_code for task in done)
        SlowView.release.set()
        admitted = [(await task).status_code for task in pending]
        again = await get("/adrf/slow")  # both slots were given back with the responses
        return [*refused, *admitted, again.status_code]

    statuses = run(main())[0]
    assert statuses == [429, 429, 429, 200, 200, 200]


@pytest.mark.parametrize("connections", ["own", "pool"])
def test_request_threads_of_their_own_reuse_one_connection(
        settings: Any, redis_url: str, connections: str) -> None:
    """Under ASGI each request's sync work (adrf's throttles, any sync DRF view) runs in a new thread:
    the per-thread path hands the connection of a thread that ended to the next one, and the pool path
    returns it to the pool, so 10 requests one after another open one connection for their decisions either
    way."""
    key = make_key(make_tier("many", [("hour", "sliding_window", 1000, 3600, None, "")]))
    upstream = urlsplit(redis_url)
    with tcp_proxy(upstream.hostname or "127.0.0.1", upstream.port or 6379) as proxy:
        settings.RATELIMIT = {**settings.RATELIMIT, "CONNECTIONS": connections, "METRICS_ENABLED": False,
                              "REDIS_URL": f"redis://127.0.0.1:{proxy.port}{upstream.path or '/0'}"}
        responses = [run(get("/adrf/tier", key))[0] for _ in range(10)]
        assert [r.status_code for r in responses] == [200] * 10
        assert parse_ietf(responses[-1]["RateLimit"])["hour"]["r"] == 990
        # per_thread: the decisions' connection and one of the client's pool, which reads the edit epoch
        # once a second (ratelimit_app.plans.edits); on the pool path both share the one connection
        assert proxy.connections == (1 if connections == "pool" else 2)


@pytest.fixture(params=["middleware", "alone"])
def middleware(request: pytest.FixtureRequest, settings: Any) -> str:
    """Each test twice: under RateLimitMiddleware (which ends a request whose view raised), and without it
    (RateLimitHeadersMixin ends it)."""
    if request.param == "alone":
        settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "RateLimitMiddleware" not in m]
    return str(request.param)


def test_an_async_view_that_raises_gives_its_slot_back_without_blocking_the_loop(middleware: str) -> None:
    slot = Policy("adrf-one-slot", CONCURRENCY, limit=1, period=OneSlot.lease)
    for _ in range(2):  # the slot of the first is given back: the second is admitted, and raises too
        with pytest.raises(Broken):
            run(get("/adrf/broken"))
        # given back by the releasing thread (adrf answers the exception on the event loop)
        assert poll(lambda: get_limiter().peek("throttle:adrf-one-slot:ip:127.0.0.1", (slot,)).remaining == 1,
                    10.0)


def test_an_async_view_that_raises_settles_the_usage_it_reported_without_blocking_the_loop(middleware: str) -> None:
    tier = make_tier("adrftokens", [("minute", "fixed_window", 100, 60, None, "")])
    TierLimit.objects.create(tier=tier, name="tokens", algorithm="sliding_window", limit=1000, period=60,
                             unit="tokens")
    key = make_key(tier)
    tokens = Policy("tokens", "sliding_window", limit=1000, period=60, unit="tokens")
    with pytest.raises(Broken):
        run(get("/adrf/broken-chat", key))
    # settled at the 100 it reported, in a worker thread (adrf answers the exception on the event loop)
    assert poll(lambda: get_limiter().peek(f"key:{key.partition('.')[0]}", (tokens,)).remaining == 900, 10.0)
