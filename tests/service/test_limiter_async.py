"""The asyncio limiter service: the same answers and the same state as the sync service, and a hung Redis
(a private redis-server stopped with SIGSTOP) answered within the budget without blocking the event loop.

Outages happen to a redis-server this test starts, never to the shared Redis. Latency bounds are
correctness bounds with a tolerance for a loaded CI box (as in test_resilience.py), not benchmarks.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis

from devtools.embedded import RedisProcess
from ratelimit_app import AsyncRateLimiter, BackendError, Policy
from ratelimit_app.core.scripts import decide_source
from ratelimit_app.service.limiter import get_limiter
from ratelimit_app.service.limiter_async import AsyncLimiterService, get_async_limiter
from tests.support.topology import command_calls

T = TypeVar("T")
DAY = [Policy("day", "sliding_window", limit=10, period=86400)]




@pytest.fixture
def admin(server: RedisProcess) -> Iterator[redis.Redis]:
    """A client of the private server for assertions (not the limiter's)."""
    client = redis.Redis(port=server.port, socket_timeout=10)
    client.script_load(decide_source())  # no NOSCRIPT round trip in what the tests count or time
    yield client
    client.close()


def configure(settings: Any, url: str, **overrides: Any) -> AsyncLimiterService:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": url, "SOCKET_CONNECT_TIMEOUT": 5.0,
                          "SOCKET_TIMEOUT": 5.0, **overrides}
    return get_async_limiter()


def run(service: AsyncLimiterService, scenario: Callable[[], Awaitable[T]]) -> T:
    """Run `scenario()` in a new event loop, then close the client the service made for that loop."""
    async def main() -> T:
        try:
            return await scenario()
        finally:
            await service.aclose()

    return asyncio.run(main())


def test_the_async_service_shares_state_and_answers_with_the_sync_service(
        settings: Any, server: RedisProcess, admin: redis.Redis) -> None:
    service = configure(settings, server.url)
    sync = get_limiter()
    assert service.guard is sync.guard  # one breaker, one deny cache, one set of counters per process

    async def scenario() -> None:
        for n in range(5):
            decision = await service.hit("k", DAY)
            assert decision.allowed and not decision.degraded and decision.remaining == 9 - n
        assert sync.hit("k", DAY).remaining == 4  # one state in Redis, whichever service charges it
        assert (await service.peek("k", DAY)).remaining == 4
        decisions = await service.hit_many([("ip:1", DAY), ("k", DAY)], cost=4)
        assert [d.remaining for d in decisions] == [6, 0]
        # denied by Redis once: the same request is then denied by the deny cache both services share
        assert not (await service.hit("k", DAY)).allowed
        # (the first answer from the cache reads the reset epoch for the first time, which counts as a
        # reset: it asks Redis once more; see test_resilience's flood test)
        assert not (await service.hit("k", DAY)).allowed
        evalsha = command_calls(admin, "evalsha")
        for _ in range(100):
            assert not (await service.hit("k", DAY)).allowed
            assert not sync.hit("k", DAY).allowed
        assert command_calls(admin, "evalsha") == evalsha
        assert service.stats().deny_cache_hits == 200 + 1
        # a reset reaches Redis and the shared deny cache
        await service.reset("k", DAY)
        assert (await service.hit("k", DAY)).remaining == 9

    run(service, scenario)
    with pytest.raises(ValueError, match="fail_mode"):
        run(service, lambda: service.hit("k", DAY, fail_mode="sometimes"))
    with pytest.raises(ValueError, match="cost"):
        run(service, lambda: service.hit("k", DAY, cost=0))


def test_each_event_loop_gets_its_own_client(settings: Any, server: RedisProcess) -> None:
    service = configure(settings, server.url)
    first = asyncio.run(_limiter_of(service))
    second = asyncio.run(_limiter_of(service))
    assert first is not second
    # and both decided against the one Redis
    assert get_limiter().peek("loop", DAY).remaining == 8


async def _limiter_of(service: AsyncLimiterService) -> Any:
    await service.hit("loop", DAY)
    engine = service.limiter()
    await service.aclose()
    return engine


async def ticker(stop: asyncio.Event, lags: list[float], every: float = 0.005) -> None:
    """Wake up every `every` seconds and record how late each wake-up was (the event loop's lag)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        expected = loop.time() + every
        await asyncio.sleep(every)
        lags.append(loop.time() - expected)


def assert_answered_within_the_budget(durations: list[float], lags: list[float], budget_ms: int) -> None:
    """Requests made while Redis hung each ended within the budget, give or take the machine's own delay, and
    the event loop was never held for a budget's length.

    The allowance over the budget is 100 ms plus the longest the loop itself was late (the ticker's lags):
    on a busy machine the same delay that wakes the ticker late ends a request late, while a call that
    blocked the loop would hold it for at least a whole budget, which the lag bound refuses.
    """
    held = max(lags)
    assert held < budget_ms / 1000 * 0.9, f"the event loop was held for {held * 1000:.0f} ms"
    bound = (budget_ms + 100) / 1000 + held
    assert max(durations) <= bound, (f"a request took {max(durations) * 1000:.0f} ms, over the budget "
                                     f"+ 100 ms + the loop's longest lag ({held * 1000:.0f} ms)")


@pytest.mark.parametrize("mode", ["open", "closed", "local"])
def test_a_hung_redis_is_answered_within_the_budget_and_the_loop_keeps_serving(
        settings: Any, server: RedisProcess, admin: redis.Redis, mode: str) -> None:
    """SIGSTOP: Redis accepts connections and bytes (the kernel does) but never answers.

    The budget is 300 ms here so that the two outcomes cannot be confused: a call that blocked the
    event loop would delay the ticker by at least 300 ms (8 at once: 2.4 s), while a loop that keeps
    serving shows only scheduling noise.
    """
    budget_ms = 300
    service = configure(settings, server.url, FAIL_MODE=mode, BUDGET_MS=budget_ms, BREAKER_FAILURES=1000,
                        APP_SERVERS=1)

    async def scenario() -> tuple[list[float], list[float], int]:
        assert not (await service.hit("k", DAY)).degraded  # connected and warm
        server.process.send_signal(signal.SIGSTOP)
        stop, lags = asyncio.Event(), list[float]()
        ticking = asyncio.create_task(ticker(stop, lags))
        durations: list[float] = []

        async def one_request(n: int) -> None:
            started = time.perf_counter()
            decision = await service.hit(f"client:{n % 3}", DAY)
            durations.append(time.perf_counter() - started)
            if mode == "open":
                assert decision.allowed and decision.degraded
            elif mode == "closed":
                assert not decision.allowed and decision.degraded and (decision.retry_after or 0) > 0
            else:
                assert decision.degraded  # the local fallback, 10 a day each: all within it

        for _ in range(3):  # three waves of 8 concurrent requests, each wave waiting on the hung Redis
            await asyncio.gather(*(one_request(n) for n in range(8)))
        stop.set()
        await ticking
        return durations, lags, len(lags)

    durations, lags, ticks = run(service, scenario)
    assert len(durations) == 24
    assert_answered_within_the_budget(durations, lags, budget_ms)
    assert statistics.median(durations) >= budget_ms / 1000 * 0.9  # they did wait on Redis, not skip it
    # the loop kept serving: the ticker woke up all through the outage
    assert ticks >= 3 * budget_ms / 1000 / 0.005 / 4
    stats = service.stats()
    assert stats.redis_failures == 24 and stats.breaker.state == "closed"


def test_the_breaker_opens_on_a_hung_redis_and_later_calls_skip_it(
        settings: Any, server: RedisProcess, admin: redis.Redis) -> None:
    service = configure(settings, server.url, FAIL_MODE="closed", BUDGET_MS=50, BREAKER_FAILURES=3,
                        BREAKER_COOLDOWN=30.0, BREAKER_MAX_COOLDOWN=30.0)

    async def scenario() -> None:
        assert not (await service.hit("k", DAY)).degraded
        server.process.send_signal(signal.SIGSTOP)
        for _ in range(3):
            assert (await service.hit("k", DAY)).degraded
        assert service.stats().breaker.state == "open"
        for _ in range(200):
            refused = await service.hit("k", DAY)
            assert not refused.allowed and refused.degraded and 0 < (refused.retry_after or 0) <= 30
        assert service.stats().redis_failures == 3  # the open breaker sent none of the 200 to Redis
        assert service.stats().degraded_closed == 203

    run(service, scenario)


def test_without_a_url_the_django_redis_cache_is_copied_into_an_asyncio_client(settings: Any) -> None:
    import redis.asyncio

    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": None, "CACHE_ALIAS": "default"}
    service = get_async_limiter()

    async def scenario() -> None:
        engine = service.limiter()
        assert isinstance(engine, AsyncRateLimiter)
        client = engine.client
        assert isinstance(client, redis.asyncio.Redis) and client.connection_pool.connection_kwargs["protocol"] == 2
        assert (await service.hit("alias", DAY)).remaining == 9

    run(service, scenario)
    assert get_limiter().peek("alias", DAY).remaining == 9  # the cache's Redis, seen by the sync service


async def admitted_by_tasks(service: AsyncLimiterService, identity: str, policies: list[Policy], tasks: int,
                            hits: int) -> list[Any]:
    """`tasks` asyncio tasks released together, `hits` service hits each; every decision."""
    start = asyncio.Event()

    async def one_task() -> list[Any]:
        await start.wait()
        return [await service.hit(identity, policies) for _ in range(hits)]

    running = [asyncio.create_task(one_task()) for _ in range(tasks)]
    await asyncio.sleep(0)
    start.set()
    return [decision for decisions in await asyncio.gather(*running) for decision in decisions]


def test_a_reset_announced_elsewhere_ends_a_cached_denial_within_the_check_interval(
        settings: Any, server: RedisProcess, admin: redis.Redis) -> None:
    from ratelimit_app.service.denycache import RESET_CHECK_INTERVAL
    from ratelimit_app.service.limiter import LimiterService

    service = configure(settings, server.url)
    elsewhere = LimiterService()  # another process: its own deny cache and reset watch, the same Redis
    tight = [Policy("day", "gcra", limit=1, period=86400)]

    async def scenario() -> None:
        assert (await service.hit("k", tight)).allowed
        for _ in range(3):  # denied by Redis, then (after the first epoch read) from the deny cache
            assert not (await service.hit("k", tight)).allowed
        elsewhere.reset("k", tight)  # deletes the state and announces the reset epoch
        await asyncio.sleep(RESET_CHECK_INTERVAL)  # the interval after which the epoch is read again
        assert (await service.hit("k", tight)).allowed  # the epoch changed: the cache was dropped

    run(service, scenario)


def test_the_async_service_takes_and_releases_slots_and_never_caches_their_refusal(
        settings: Any, server: RedisProcess, admin: redis.Redis) -> None:
    from ratelimit_app.core.engine import new_lease_token

    service = configure(settings, server.url)
    slots = [Policy("concurrency", "concurrency", limit=1, period=60)]

    async def scenario() -> None:
        first, second = new_lease_token(), new_lease_token()
        assert (await service.hit("k", slots, lease=first)).allowed
        assert not (await service.hit("k", slots, lease=second)).allowed
        assert len(service.guard.deny_cache) == 0  # a slot may free at any moment: not cached
        assert await service.release([("k", slots[0])], first)
        assert (await service.hit_many([("k", slots)], lease=second))[0].allowed
        assert await service.renew([("k", slots[0])], second, 1000) is True
        assert await service.renew([("k", slots[0])], second) is True
        assert await service.release([("k", slots[0])], second)
        assert await service.renew([("k", slots[0])], second) is False  # given back: not taken again
        assert await service.renew([("k", slots[0])], second, local=True) is True

    run(service, scenario)


def test_the_async_renew_is_none_when_redis_cannot_be_asked(settings: Any, server: RedisProcess) -> None:
    service = configure(settings, server.url, BREAKER_FAILURES=2)
    slot = Policy("concurrency", "concurrency", limit=1, period=60)

    async def scenario() -> list[bool | None]:
        server.process.send_signal(signal.SIGSTOP)
        try:
            settings.RATELIMIT = {**settings.RATELIMIT, "BUDGET_MS": 100}
            return [await service.renew([("k", slot)], "token") for _ in range(3)]
        finally:
            server.process.send_signal(signal.SIGCONT)

    assert run(service, scenario) == [None, None, None]
    assert service.stats().redis_failures == 2  # the open breaker skipped the third


def test_call_redis_runs_one_command_of_the_callers_as_the_sync_service_does(settings: Any, server: RedisProcess,
                                                                             key_prefix: str) -> None:
    service = configure(settings, server.url, KEY_PREFIX=key_prefix, BREAKER_FAILURES=1)
    marker = f"{key_prefix}:marker"

    async def calls() -> list[Any]:
        await service.hit("client", [Policy("minute", "fixed_window", limit=5, period=60)])  # builds the engine
        said = [await service.call_redis(lambda client: client.set(marker, "1", ex=60)),
                await service.call_redis(lambda client: client.get(marker))]
        service.guard.breaker.record_failure(ConnectionError("down"))
        try:
            await service.call_redis(lambda client: client.get(marker))
        except BackendError as exc:
            said.append(str(exc))
        return said

    assert run(service, calls) == [True, b"1", "the limiter's circuit breaker is open: Redis is not asked"]
