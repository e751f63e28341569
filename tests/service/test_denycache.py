"""ratelimit_app.service.denycache: what `DenyCache` remembers and for how long, what it drops first when
full, `forget` and `clear`; and `ResetWatch`, the reset epoch in Redis that processes read at most once
per interval."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest
import redis
import redis.asyncio

from ratelimit_app import Decision, PolicyResult
from ratelimit_app.core.redispy import close_client
from ratelimit_app.service.denycache import RESET_CHECK_INTERVAL, DenyCache, ResetWatch, reset_epoch_key


def denial(retry_after: float | None, *, degraded: bool = False, policy: str = "burst") -> Decision:
    result = PolicyResult(policy, False, 3, 0, retry_after or 0.0, retry_after)
    return Decision(False, 3, 0, retry_after or 0.0, retry_after, policy, (result,), degraded)


ALLOWED = Decision(True, 3, 2, 1.0, None, "burst", (PolicyResult("burst", True, 3, 2, 1.0, None),), False)


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "10"])
def test_a_size_that_is_not_a_positive_integer_is_refused(size: object) -> None:
    with pytest.raises(ValueError, match="size"):
        DenyCache(size)  # type: ignore[arg-type]


@pytest.mark.parametrize("decisions", [
    [ALLOWED], [denial(4.0, degraded=True)], [denial(None)], [denial(0.0)], [],
])
def test_only_a_denial_by_the_requests_own_policies_with_a_retry_time_is_remembered(
    decisions: list[Decision],
) -> None:
    cache = DenyCache(10)
    cache.remember("k", ("key:a",), decisions, 100.0)
    assert len(cache) == 0 and cache.get("k", 100.0) is None


def test_an_entry_lasts_until_the_longest_retry_a_little_early_and_is_dropped_when_looked_up_after() -> None:
    cache = DenyCache(10)
    cache.remember("k", ("ip:1", "key:a"), [denial(2.0), denial(10.0, policy="day")], 100.0)
    until = 100.0 + 10.0 * (1 - 1e-3)  # never outlasts the denial Redis announced
    assert cache.get("k", until - 0.001) is not None
    assert cache.get("k", until) is None
    assert len(cache) == 0
    assert cache.hits == 1


def test_a_cost_above_capacity_is_remembered_for_a_minute() -> None:
    cache = DenyCache(10)
    cache.remember("k", ("key:a",), [denial(math.inf)], 100.0)
    [answer] = cache.get("k", 159.9) or []
    assert answer.retry_after == math.inf  # never shifted
    assert cache.get("k", 160.0) is None


def test_when_full_expired_entries_go_first_then_the_oldest() -> None:
    cache = DenyCache(3)
    cache.remember("short", ("a",), [denial(1.0)], 100.0)
    cache.remember("b", ("b",), [denial(60.0)], 100.0)
    cache.remember("c", ("c",), [denial(60.0)], 100.0)
    cache.remember("d", ("d",), [denial(60.0)], 102.0)  # "short" expired: it goes, the older "b" stays
    assert [cache.get(k, 102.0) is not None for k in ("short", "b", "c", "d")] == [False, True, True, True]
    cache.remember("e", ("e",), [denial(60.0)], 103.0)  # nothing expired: the oldest goes
    assert [cache.get(k, 103.0) is not None for k in ("b", "c", "d", "e")] == [False, True, True, True]
    cache.remember("e", ("e",), [denial(30.0)], 104.0)  # a key already there replaces its entry, evicts nothing
    assert len(cache) == 3 and cache.get("c", 104.0) is not None


def test_forget_drops_every_entry_involving_the_identity_and_clear_drops_all() -> None:
    cache = DenyCache(10)
    cache.remember("alone", ("key:a",), [denial(60.0)], 100.0)
    cache.remember("with-ip", ("ip:1", "key:a"), [denial(60.0), denial(60.0)], 100.0)
    cache.remember("other", ("key:b",), [denial(60.0)], 100.0)
    generation = cache.generation
    assert cache.forget("key:a") == 2
    assert cache.get("other", 100.0) is not None and len(cache) == 1
    assert cache.forget("key:zzz") == 0
    assert cache.generation == generation + 2  # every forget counts: a reset happened, found or not
    cache.clear()
    assert len(cache) == 0 and cache.generation == generation + 3


def test_the_reset_epoch_key_lives_under_the_prefix() -> None:
    assert reset_epoch_key("app:rl") == "app:rl:{resets}:epoch"
    assert ResetWatch("app:rl").key == "app:rl:{resets}:epoch"


def test_announce_writes_a_new_epoch_that_expires_each_time(redis_client: redis.Redis, key_prefix: str) -> None:
    watch = ResetWatch(key_prefix)
    assert watch.announce(redis_client)
    first = redis_client.get(watch.key)
    assert 0 < redis_client.ttl(watch.key) <= 86400
    watch.announce(redis_client)
    assert redis_client.get(watch.key) not in (None, first)


def test_announce_with_an_asyncio_client_gives_the_coroutine_to_await(redis_url: str, key_prefix: str,
                                                                      redis_client: redis.Redis) -> None:
    watch = ResetWatch(key_prefix)

    async def announce() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            await watch.announce(client)
        finally:
            await close_client(client)  # redis-py 5.0.0 (the oldest supported) has no aclose()

    asyncio.run(announce())
    assert redis_client.get(watch.key) is not None


def test_the_epoch_is_due_for_one_caller_per_interval() -> None:
    watch = ResetWatch("rl")
    assert watch.interval == RESET_CHECK_INTERVAL
    assert watch.due(100.0) and not watch.due(100.0) and not watch.due(100.0 + RESET_CHECK_INTERVAL - 0.001)
    assert watch.due(100.0 + RESET_CHECK_INTERVAL)
    start = threading.Barrier(16)
    answers: list[bool] = []

    def ask() -> None:
        start.wait()
        answers.append(watch.due(200.0))

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [False] * 15 + [True]


def test_the_first_read_counts_as_a_change_and_then_only_a_different_epoch(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    watch = ResetWatch(key_prefix)
    assert watch.changed(redis_client.get(watch.key))  # None: nothing announced yet, still a first read
    assert not watch.changed(redis_client.get(watch.key))
    watch.announce(redis_client)
    assert watch.changed(redis_client.get(watch.key))
    assert not watch.changed(redis_client.get(watch.key))
    redis_client.delete(watch.key)  # expired: processes clear once, harmlessly
    assert watch.changed(redis_client.get(watch.key))
