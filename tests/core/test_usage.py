"""Usage limits against a real Redis: an estimate reserved in the decision's one call, the real usage
settled by lua/settle.lua (the unused part given back, an overrun charged), sync and async, exact under
concurrency."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
import redis.asyncio

from ratelimit_app import AsyncRateLimiter, Policy, RateLimiter
from ratelimit_app.core.redispy import close_client
from ratelimit_app.core.usage import NO_RESERVATION, settle_calls, usage_pairs

#: (algorithm, limit) of every usage limit that settles exactly: the sliding log short and long (a key
#: of its own from 128 units on), and the counters in their window
SETTLING = [("sliding_window", 100), ("sliding_window", 1000), ("fixed_window", 1000),
            ("sliding_window_counter", 1000), ("token_bucket", 1000), ("gcra", 1000)]


def tokens(algorithm: str, limit: int) -> Policy:
    """A usage limit of `limit` tokens a day (nothing refills or slides out during a test)."""
    return Policy("tokens", algorithm, limit=limit, period=86400, unit="tokens")


def requests() -> Policy:
    return Policy("day", "fixed_window", limit=10, period=86400)


@pytest.mark.parametrize(("algorithm", "limit"), SETTLING)
def test_settling_gives_back_the_unused_part_and_charges_an_overrun(limiter: RateLimiter, algorithm: str,
                                                                   limit: int) -> None:
    policies = [requests(), tokens(algorithm, limit)]
    estimate = limit // 2
    decision, reservation = limiter.reserve("client", policies, {"tokens": estimate})
    assert decision.allowed
    by_name = {result.policy: result for result in decision.results}
    assert by_name["day"].remaining == 9  # a request's cost, one
    assert by_name["tokens"].remaining == limit - estimate  # the estimate, reserved in the same call
    assert limiter.settle(reservation, {"tokens": limit // 10}) == 1
    left = {r.policy: r.remaining for r in limiter.peek("client", policies).results}
    assert left == {"day": 9, "tokens": limit - limit // 10}

    _, second = limiter.reserve("client", policies, {"tokens": limit // 10})
    limiter.settle(second, {"tokens": limit // 2})  # an overrun of limit // 2 - limit // 10
    left = {r.policy: r.remaining for r in limiter.peek("client", policies).results}
    assert left == {"day": 8, "tokens": limit - limit // 10 - limit // 2}


@pytest.mark.parametrize(("algorithm", "limit"), SETTLING)
def test_an_estimate_that_does_not_fit_is_refused_and_reserves_nothing(limiter: RateLimiter, algorithm: str,
                                                                      limit: int) -> None:
    policies = [requests(), tokens(algorithm, limit)]
    _, first = limiter.reserve("client", policies, {"tokens": limit - 10})
    decision, reservation = limiter.reserve("client", policies, {"tokens": 11})
    assert not decision.allowed and decision.policy == "tokens"
    assert reservation is NO_RESERVATION
    assert {r.policy: r.remaining for r in limiter.peek("client", policies).results} == {"day": 9, "tokens": 10}
    limiter.settle(first, {"tokens": 0})
    assert {r.policy: r.remaining for r in limiter.peek("client", policies).results} == {"day": 9, "tokens": limit}


def test_sixteen_of_thirty_fit_when_each_reserves_500_and_uses_100(limiter: RateLimiter) -> None:
    policies = [tokens("sliding_window", 2000)]
    admitted = 0
    for _ in range(30):
        decision, reservation = limiter.reserve("client", policies, {"tokens": 500})
        if decision.allowed:
            admitted += 1
            limiter.settle(reservation, {"tokens": 100})
    assert admitted == 16  # 15 x 100 used, + 500 reserved = 2,000; a 17th needs 500 of the 400 left


def test_a_plain_hit_never_charges_a_usage_limit(limiter: RateLimiter) -> None:
    with pytest.raises(ValueError, match="reserve"):
        limiter.hit("client", [requests(), tokens("sliding_window", 100)])
    decision, _ = limiter.reserve("client", [requests(), tokens("sliding_window", 100)], {"words": 5})
    assert {r.policy: r.remaining for r in decision.results} == {"day": 9}  # no estimate of tokens: left out
    assert limiter.peek("client", [tokens("sliding_window", 100)]).remaining == 100


def test_concurrent_reservations_are_exact(limiter: RateLimiter) -> None:
    policies = [tokens("sliding_window", 2000)]
    admitted: list[bool] = []
    barrier = threading.Barrier(20)

    def reserve() -> None:
        barrier.wait()
        admitted.append(limiter.reserve("client", policies, {"tokens": 500})[0].allowed)

    threads = [threading.Thread(target=reserve) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert admitted.count(True) == 4


def test_a_settlement_that_never_comes_leaves_the_estimate_charged_with_a_ttl(
        limiter: RateLimiter, redis_client: redis.Redis) -> None:
    policies = [tokens("sliding_window", 1000)]
    limiter.reserve("client", policies, {"tokens": 300})
    assert limiter.peek("client", policies).remaining == 700
    for key in limiter.keys("client", policies):
        assert redis_client.pttl(key) > 0


def test_bad_usage_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="tokens"):
        usage_pairs({"tokens": 0})
    with pytest.raises(ValueError, match="unit"):
        usage_pairs({"Tokens!": 5})
    with pytest.raises(ValueError, match="used"):
        settle_calls(NO_RESERVATION, {"tokens": -1})


@pytest.mark.parametrize(("algorithm", "limit"), SETTLING)
def test_the_async_twin_settles_alike(redis_url: str, key_prefix: str, algorithm: str, limit: int) -> None:
    policies = [requests(), tokens(algorithm, limit)]

    async def main() -> dict[str, int]:
        client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(redis_url, socket_timeout=10)
        try:
            limiter = AsyncRateLimiter(client, prefix=key_prefix)
            decisions = await asyncio.gather(*(limiter.reserve("client", policies, {"tokens": limit // 4})
                                               for _ in range(6)))
            assert [decision.allowed for decision, _ in decisions].count(True) == 4
            for _, reservation in decisions:
                await limiter.settle(reservation, {"tokens": limit // 10})
            return {r.policy: r.remaining for r in (await limiter.peek("client", policies)).results}
        finally:
            await close_client(client)

    assert asyncio.run(main()) == {"day": 6, "tokens": limit - 4 * (limit // 10)}
