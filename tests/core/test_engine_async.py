"""The asyncio engine against a real Redis: the same decisions as the sync engine, the same errors, the same
recovery, and exactness under 32 concurrent tasks.

Each test runs its coroutine with `asyncio.run`: a redis.asyncio client belongs to the event loop it
was first used on, so every test builds its own inside its own loop.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio

from devtools.embedded import RedisProcess, free_port
from ratelimit_app import AsyncRateLimiter, BackendError, Policy, RateLimiter
from ratelimit_app.core.budget import reply_wait
from ratelimit_app.core.policies import ALGORITHMS
from ratelimit_app.core.redispy import close_client
from tests.support.budget import within_budget
from tests.support.tcp_proxy import tcp_proxy
from tests.support.topology import wait_for

EXACT = ["fixed_window", "sliding_window", "token_bucket", "gcra"]
#: (algorithm, limit) of the tightest policy of the exactness tests: every exact algorithm at 40, and a
#: sliding log long enough to have a key of its own (lua/sliding_window.lua)
TIGHTEST = [*((algorithm, 40) for algorithm in EXACT), ("sliding_window", 160)]
T = TypeVar("T")


@pytest.fixture(params=["own", "pool"])
def async_connections(request: pytest.FixtureRequest) -> str:
    """Every async engine test runs on both paths: the limiter's own connections and the client's pool."""
    return str(request.param)


def tier(algorithm: str, limit: int) -> list[Policy]:
    """A 3-policy tier whose tightest policy is `algorithm` at `limit` per day (no refill during a test)."""
    return [
        Policy("tight", algorithm, limit=limit, period=86400),
        Policy("minute", "sliding_window", limit=10 * limit, period=60),
        Policy("day", "fixed_window", limit=100 * limit, period=86400),
    ]


def run_with(redis_url: str, scenario: Callable[[redis.asyncio.Redis], Awaitable[T]], **options: Any) -> T:
    """Run `scenario(client)` in a new event loop with a client of that loop, closed afterwards."""
    async def main() -> T:
        client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(redis_url, **{"socket_timeout": 10, **options})
        try:
            return await scenario(client)
        finally:
            await close_client(client)

    return asyncio.run(main())


async def fixed_window_margin(limiter: AsyncRateLimiter, identity: str, policies: list[Policy], margin: float) -> None:
    """Fixed windows are aligned to the epoch: start a test well inside one, per Redis' own clock."""
    fixed = [p for p in policies if p.algorithm == "fixed_window"]
    if fixed:
        decision = await limiter.peek(identity, fixed)
        if decision.reset_after < margin:
            await asyncio.sleep(decision.reset_after + 0.01)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_admits_exactly_the_limit_then_recovers(redis_url: str, key_prefix: str, algorithm: str,
                                                async_connections: str) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
        policies = [Policy("p", algorithm, limit=5, period=2.0)]
        await fixed_window_margin(limiter, "client", policies, margin=1.0)
        decisions = [await limiter.hit("client", policies) for _ in range(7)]
        assert [d.allowed for d in decisions] == [True] * 5 + [False] * 2
        assert [d.remaining for d in decisions[:5]] == [4, 3, 2, 1, 0]
        denied = decisions[-1]
        assert denied.retry_after is not None and 0 < denied.retry_after <= policies[0].state_ttl
        assert denied.policy == "p" and denied.limit == 5
        await asyncio.sleep(denied.retry_after)  # waiting exactly what the limiter said is enough
        assert (await limiter.hit("client", policies)).allowed

    run_with(redis_url, scenario)


def test_a_clock_shift_moves_redis_time_as_for_the_sync_engine(redis_url: str, key_prefix: str,
                                                               async_connections: str) -> None:
    policy = Policy("p", "fixed_window", limit=1, period=3600)
    hour = 3_600_000

    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
        assert (await limiter.hit("c", [policy])).allowed
        assert not (await limiter.hit("c", [policy])).allowed
        assert (await limiter.peek("c", [policy], clock_shift_ms=hour)).allowed
        assert [d.allowed for d in await limiter.hit_many([("c", [policy])], clock_shift_ms=hour)] == [True]
        assert not (await limiter.hit("c", [policy], clock_shift_ms=hour)).allowed  # the next hour is used now

    run_with(redis_url, scenario)


def test_the_same_state_gives_the_same_decision_as_the_sync_engine(
        redis_url: str, redis_client: redis.Redis, key_prefix: str, async_connections: str) -> None:
    policies = [
        Policy("burst", "token_bucket", limit=20, period=3600, burst=3),
        Policy("minute", "sliding_window", limit=20, period=60),
        Policy("day", "fixed_window", limit=1000, period=86400),
    ]
    sync = RateLimiter(redis_client, prefix=key_prefix)

    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
        await fixed_window_margin(limiter, "k", policies, margin=5)
        first = await limiter.hit("k", policies)
        assert (first.allowed, first.policy, first.limit, first.remaining) == (True, "burst", 3, 2)
        assert sync.hit("k", policies).remaining == 1  # one state, whichever engine charges it
        assert (await limiter.hit("k", policies)).remaining == 0
        for _ in range(3):
            denied = await limiter.hit("k", policies)
            assert not denied.allowed and denied.policy == "burst" and denied.retry_after is not None
        ours, theirs = await limiter.peek("k", policies), sync.peek("k", policies)
        assert [(r.policy, r.allowed, r.remaining) for r in ours.results] == \
            [(r.policy, r.allowed, r.remaining) for r in theirs.results] == \
            [("burst", False, 0), ("minute", True, 17), ("day", True, 997)]
        assert type(ours) is type(theirs) and (ours.allowed, ours.policy, ours.remaining) == \
            (theirs.allowed, theirs.policy, theirs.remaining)

    run_with(redis_url, scenario)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cost_larger_than_capacity_is_denied_without_charge(redis_url: str, key_prefix: str, algorithm: str,
                                                            async_connections: str) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
        policies = [Policy("p", algorithm, limit=5, period=60)]
        decision = await limiter.hit("k", policies, cost=6)
        assert not decision.allowed and decision.retry_after == math.inf
        assert (await limiter.peek("k", policies)).remaining == 5
        assert (await limiter.hit("k", policies, cost=5)).allowed

    run_with(redis_url, scenario)


def test_hit_many_is_all_or_nothing_on_one_redis(redis_url: str, key_prefix: str, async_connections: str) -> None:
    ip = [Policy("ip", "sliding_window", limit=5, period=60)]
    key = [Policy("burst", "gcra", limit=2, period=60)]

    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
        for _ in range(2):
            assert all(d.allowed for d in await limiter.hit_many([("ip:1", ip), ("key:1", key)]))
        refused = await limiter.hit_many([("ip:1", ip), ("key:1", key)])
        # the key denied, so the IP (which allowed) was not charged either
        assert [d.allowed for d in refused] == [False, False]
        assert (await limiter.peek("ip:1", ip)).remaining == 3

    run_with(redis_url, scenario)


def test_reset_forgets_the_identity(redis_url: str, redis_client: redis.Redis, key_prefix: str,
                                    async_connections: str) -> None:
    policies = [Policy(f"p{i}", a, limit=2, period=60) for i, a in enumerate(ALGORITHMS)]

    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
        await limiter.hit("k", policies)
        await limiter.hit("k", policies)
        assert not (await limiter.hit("k", policies)).allowed
        await limiter.reset("k", policies)
        assert redis_client.exists(*limiter.keys("k", policies)) == 0
        assert (await limiter.hit("k", policies)).allowed

    run_with(redis_url, scenario)


def test_script_flush_is_recovered_and_charges_once(server: RedisProcess, key_prefix: str,
                                                     async_connections: str) -> None:
    """On a Redis of the test's own: SCRIPT FLUSH empties the script cache of every app using a server."""
    policies = [Policy("p", "sliding_window", limit=10, period=60), Policy("day", "gcra", limit=10, period=86400)]
    admin: redis.Redis = redis.Redis.from_url(server.url, socket_timeout=10)

    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
        assert (await limiter.hit("k", policies)).remaining == 9
        admin.script_flush()
        assert (await limiter.hit("k", policies)).allowed
        assert [r.remaining for r in (await limiter.peek("k", policies)).results] == [8, 8]

    run_with(server.url, scenario)
    admin.close()


def test_client_retries_never_replay_a_decision(redis_url: str, key_prefix: str, async_connections: str) -> None:
    """A reply lost after sending is never resent, even by a client configured to retry 5 times."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    target = urlsplit(redis_url)
    policies = [Policy("p", "sliding_window", limit=10, period=60)]
    with tcp_proxy(target.hostname or "127.0.0.1", target.port or 6379) as proxy:
        async def scenario(client: redis.asyncio.Redis) -> None:
            limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
            await limiter.hit("k", policies)  # loads the script, warms the connection
            proxy.mode = "drop_replies"  # the EVALSHA reaches Redis and is charged; its reply is lost
            sent_before = proxy.commands_seen("EVALSHA")
            with pytest.raises(BackendError) as raised:
                await limiter.hit("k", policies)
            assert proxy.commands_seen("EVALSHA") == sent_before + 1  # written once, never again
            assert raised.value.maybe_applied and isinstance(raised.value.__cause__, RedisTimeoutError)
            proxy.mode = "forward"
            assert (await limiter.peek("k", policies)).remaining == 8  # charged once: 1 before + 1 lost reply

        run_with(proxy.url, scenario, retry=Retry(NoBackoff(), 5), socket_timeout=0.5,
                 retry_on_error=[RedisTimeoutError, RedisConnectionError])


def test_unreachable_redis_raises_backend_error_not_applied(key_prefix: str, async_connections: str) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        with pytest.raises(BackendError) as raised:
            limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
            await limiter.hit("k", [Policy("p", "gcra", limit=1, period=1)])
        assert not raised.value.maybe_applied

    run_with(f"redis://127.0.0.1:{free_port()}/0", scenario, socket_connect_timeout=0.5)


def test_bad_arguments_raise_the_same_errors_as_the_sync_engine(redis_url: str, key_prefix: str,
                                                                async_connections: str) -> None:
    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
        with pytest.raises(ValueError, match="cost"):
            await limiter.hit("k", [Policy("p", "gcra", limit=1, period=1)], cost=0)
        with pytest.raises(ValueError, match="identity"):
            await limiter.hit("", [Policy("p", "gcra", limit=1, period=1)])
        with pytest.raises(TypeError, match="Policy"):
            await limiter.hit("k", ["20/m"])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="prefix"):
            AsyncRateLimiter(client, prefix="a{b}")
        with pytest.raises(ValueError, match="connections"):
            AsyncRateLimiter(client, connections="threads")

    run_with(redis_url, scenario)
    with pytest.raises(TypeError, match="redis.asyncio"):
        AsyncRateLimiter(redis.Redis())  # type: ignore[arg-type]


async def admitted_by_tasks(limiter: AsyncRateLimiter, identity: str, policies: list[Policy], tasks: int,
                            hits: int) -> int:
    """`tasks` asyncio tasks released together, `hits` hits each at `identity`; how many were admitted."""
    start = asyncio.Event()

    async def one_task() -> int:
        await start.wait()
        return sum([(await limiter.hit(identity, policies)).allowed for _ in range(hits)])

    running = [asyncio.create_task(one_task()) for _ in range(tasks)]
    await asyncio.sleep(0)  # every task is now waiting on the event
    start.set()
    return sum(await asyncio.gather(*running))


@pytest.mark.parametrize(("algorithm", "limit"), TIGHTEST)
def test_32_tasks_admit_exactly_the_limit_of_a_three_policy_tier(
        redis_url: str, key_prefix: str, algorithm: str, limit: int, async_connections: str) -> None:
    # 32 tasks x 6 hits = 192 hits at a tier whose tightest policy allows 40 (or 160: a long sliding log)
    policies = tier(algorithm, limit)

    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
        await fixed_window_margin(limiter, "apikey:hot", policies, margin=60)
        assert await admitted_by_tasks(limiter, "apikey:hot", policies, tasks=32, hits=6) == limit
        assert [r.remaining for r in (await limiter.peek("apikey:hot", policies)).results] == [0, 9 * limit, 99 * limit]

    run_with(redis_url, scenario, max_connections=32)


def test_own_connections_stay_within_the_pools_limit_and_a_closed_one_is_replaced() -> None:
    """On a private server, so connection counts are exact."""
    from devtools.embedded import start_redis
    from ratelimit_app.core.scripts import decide_source

    server = start_redis()
    admin = redis.Redis(port=server.port, socket_timeout=10)
    admin.script_load(decide_source())
    policies = [Policy("minute", "fixed_window", limit=1000, period=60)]

    def received() -> int:
        return int(admin.info("stats")["total_connections_received"])

    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix="t")
        before = received()
        # 32 tasks, a pool of 4: the limiter never holds more than 4 connections of its own
        assert await admitted_by_tasks(limiter, "k", policies, tasks=32, hits=5) == 160
        assert received() - before == 4  # (the client's own pool made none)
        # the server closes them all while they are idle: each is replaced before it is used again
        assert admin.client_kill_filter(_type="normal", skipme=True) == 4
        wait_for(lambda: len(admin.client_list()) == 1, 5.0, "the kill")
        for _ in range(2):  # one turn of the event loop reads the closes, the next runs their callbacks
            await asyncio.sleep(0)
        assert (await limiter.hit("k", policies)).remaining == 839
        assert received() - before == 5
        await limiter.aclose()

    try:
        run_with(server.url, scenario, max_connections=4)
    finally:
        admin.close()
        server.stop()


def test_concurrency_slots_are_taken_and_given_back_like_the_sync_engine(
        redis_url: str, redis_client: redis.Redis, key_prefix: str, async_connections: str) -> None:
    from ratelimit_app.core.engine import new_lease_token

    slots = Policy("concurrency", "concurrency", limit=2, period=60)
    policies = [Policy("minute", "sliding_window", limit=100, period=60), slots]
    tokens = [new_lease_token() for _ in range(3)]

    async def scenario(client: redis.asyncio.Redis) -> None:
        limiter = AsyncRateLimiter(client, prefix=key_prefix, connections=async_connections)
        with pytest.raises(ValueError, match="lease"):
            await limiter.hit("k", policies)  # a slot needs a lease token
        decisions = [await limiter.hit("k", policies, lease=token) for token in tokens]
        assert [d.allowed for d in decisions] == [True, True, False] and decisions[2].policy == "concurrency"
        assert [d.results[1].remaining for d in decisions] == [1, 0, 0]
        key = limiter.keys("k", [slots])[0]
        assert await client.zcard(key) == 2
        await limiter.release([("k", slots)], tokens[0])
        assert await client.zcard(key) == 1
        assert (await limiter.hit("k", policies, lease=tokens[2])).allowed
        await limiter.release([("k", slots)], tokens[1])
        await limiter.release([("k", slots)], tokens[2])
        assert await client.exists(key) == 0
        # the sync engine sees the same slots
        sync = RateLimiter(redis_client, prefix=key_prefix)
        assert sync.peek("k", [slots]).remaining == 2
        await limiter.aclose()

    run_with(redis_url, scenario)


def test_own_connections_wait_for_a_reply_with_one_timer_when_a_budget_ends_first(redis_url: str) -> None:
    """Alone, the limiter's own connections wait for a reply at most the client's socket timeout; under a
    time budget that ends first (the async service's, `start_budget`), the budget's timer is the only
    one, and the socket timeout is kept when the budget is the longer of the two."""
    async def scenario(client: redis.asyncio.Redis) -> list[float | None]:
        limiter = AsyncRateLimiter(client, prefix="test-reply-timer")
        waits = [reply_wait(limiter._read_timeout)]
        for budget in (0.05, 60.0):
            with within_budget(budget):
                waits.append(reply_wait(limiter._read_timeout))
        return waits

    assert run_with(redis_url, scenario, socket_timeout=10) == [10, None, 10]
