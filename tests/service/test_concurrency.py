"""Concurrency slots in the engine, the service and the local fallback, against a real Redis."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from django.http import HttpResponse

from ratelimit_app import RateLimiter
from ratelimit_app.apply.concurrency import release_with, slots_taken
from ratelimit_app.core.engine import new_lease_token
from ratelimit_app.core.policies import CONCURRENCY, InvalidPolicy, Policy
from ratelimit_app.service import limiter as service_module
from ratelimit_app.service.fallback import LocalLimiter
from ratelimit_app.service.limiter import LimiterService, get_limiter

SLOTS = Policy("concurrency", CONCURRENCY, limit=2, period=60)
MINUTE = Policy("minute", "sliding_window", limit=5, period=60)


def test_slots_are_taken_refused_and_given_back(limiter: RateLimiter, redis_client: redis.Redis) -> None:
    first, second, third = new_lease_token(), new_lease_token(), new_lease_token()
    a = limiter.hit("client", [SLOTS], lease=first)
    b = limiter.hit("client", [SLOTS], lease=second)
    assert (a.allowed, a.remaining, b.allowed, b.remaining) == (True, 1, True, 0)
    refused = limiter.hit("client", [SLOTS], lease=third)
    assert not refused.allowed and refused.policy == "concurrency" and refused.retry_after == 1.0
    assert refused.remaining == 0 and 59 < refused.reset_after <= 60  # the last lease runs out in 60 s
    [key] = limiter.keys("client", [SLOTS])
    assert redis_client.zcard(key) == 2 and redis_client.zscore(key, third) is None  # refused: no lease
    assert 59_000 < redis_client.pttl(key) <= 60_000

    limiter.release([("client", SLOTS)], first)
    assert redis_client.zscore(key, first) is None and limiter.peek("client", [SLOTS]).remaining == 1
    assert limiter.hit("client", [SLOTS], lease=third).allowed
    limiter.release([("client", SLOTS)], first)  # twice: nothing else is freed
    assert redis_client.zcard(key) == 2


def test_a_slot_costs_one_whatever_the_request_costs(limiter: RateLimiter) -> None:
    decision = limiter.hit("client", [SLOTS, MINUTE], cost=5, lease=new_lease_token())
    assert decision.allowed and {r.policy: r.remaining for r in decision.results} == {"concurrency": 1, "minute": 0}


def test_all_or_nothing_with_rate_limits(limiter: RateLimiter, redis_client: redis.Redis) -> None:
    [slot_key, _] = limiter.keys("client", [SLOTS, MINUTE])
    # refused by the rate limit: no slot is taken
    limiter.hit("client", [MINUTE], cost=5)
    refused = limiter.hit("client", [SLOTS, MINUTE], lease=new_lease_token())
    assert not refused.allowed and refused.policy == "minute"
    assert redis_client.exists(slot_key) == 0
    # refused for want of a slot: nothing is charged to the rate limit
    limiter.reset("client", [MINUTE])
    for _ in range(2):
        assert limiter.hit("client", [SLOTS, MINUTE], lease=new_lease_token()).allowed
    refused = limiter.hit("client", [SLOTS, MINUTE], lease=new_lease_token())
    assert not refused.allowed and refused.policy == "concurrency"
    assert limiter.peek("client", [MINUTE]).remaining == 3


def test_other_identities_in_the_same_call(limiter: RateLimiter) -> None:
    ip = Policy("ip", "fixed_window", limit=100, period=60)
    for _ in range(2):
        assert all(d.allowed for d in limiter.hit_many([("ip:1", [ip]), ("key:a", [SLOTS])], lease=new_lease_token()))
    decisions = limiter.hit_many([("ip:1", [ip]), ("key:a", [SLOTS])], lease=new_lease_token())
    assert [d.allowed for d in decisions] == [False, False]
    assert limiter.peek("ip:1", [ip]).remaining == 98  # the refused request charged the IP nothing


def test_reset_frees_the_slots_and_keeps_the_identitys_other_policies(
        limiter: RateLimiter, redis_client: redis.Redis) -> None:
    for _ in range(2):
        assert limiter.hit("client", [SLOTS, MINUTE], lease=new_lease_token()).allowed
    limiter.reset("client", [SLOTS])
    [slot_key] = limiter.keys("client", [SLOTS])
    assert redis_client.exists(slot_key) == 0
    assert limiter.peek("client", [SLOTS]).remaining == 2 and limiter.peek("client", [MINUTE]).remaining == 3


def test_a_lease_frees_itself_when_its_time_is_up(limiter: RateLimiter, redis_client: redis.Redis) -> None:
    short = Policy("concurrency", CONCURRENCY, limit=1, period=0.2)
    token = new_lease_token()
    assert limiter.hit("client", [short], lease=token).allowed
    [key] = limiter.keys("client", [short])
    seconds, micros = redis_client.time()
    expiry = redis_client.zscore(key, token)
    assert expiry is not None and 0 < expiry - (seconds * 1_000_000 + micros) <= 200_000
    assert not limiter.hit("client", [short], lease=new_lease_token()).allowed
    # once Redis' clock passes the expiry the slot is free (polled on Redis TIME, not a hopeful sleep)
    while True:
        seconds, micros = redis_client.time()
        if seconds * 1_000_000 + micros > expiry:
            break
    assert limiter.hit("client", [short], lease=new_lease_token()).allowed
    assert redis_client.zcard(key) == 1  # the lapsed lease was trimmed when the slot was taken


def test_a_charge_without_a_lease_is_refused(limiter: RateLimiter) -> None:
    with pytest.raises(ValueError, match="lease"):
        limiter.hit("client", [SLOTS])
    with pytest.raises(ValueError, match="lease"):
        limiter.hit("client", [SLOTS], lease="not a token!")
    assert limiter.peek("client", [SLOTS]).remaining == 2  # a peek needs none
    assert limiter.hit("client", [MINUTE]).allowed  # nor a call without a concurrency policy
    with pytest.raises(ValueError, match="lease"):  # a release names the token it gives back
        limiter.release([("client", SLOTS)], "not a token!")
    with pytest.raises(InvalidPolicy, match="burst"):
        Policy("c", CONCURRENCY, limit=2, period=60, burst=3)


def test_32_concurrent_clients_get_exactly_the_slots(limiter: RateLimiter, redis_client: redis.Redis) -> None:
    policy = Policy("concurrency", CONCURRENCY, limit=5, period=60)
    start = threading.Barrier(32)

    def client(_: int) -> bool:
        start.wait()
        return limiter.hit("hot", [policy], lease=new_lease_token()).allowed

    with ThreadPoolExecutor(32) as pool:
        admitted = list(pool.map(client, range(32)))
    assert admitted.count(True) == 5
    assert redis_client.zcard(limiter.keys("hot", [policy])[0]) == 5


def test_the_service_never_caches_a_refusal_for_want_of_a_slot(limiter: RateLimiter) -> None:
    service = LimiterService(limiter)
    held = new_lease_token()
    one = Policy("concurrency", CONCURRENCY, limit=1, period=60)
    assert service.hit_many([("client", [one])], lease=held)[0].allowed
    assert not service.hit_many([("client", [one])], lease=new_lease_token())[0].allowed
    assert len(service.guard.deny_cache) == 0
    assert service.release([("client", one)], held)
    assert service.hit_many([("client", [one])], lease=new_lease_token())[0].allowed


def test_the_local_fallback_holds_slots_like_redis() -> None:
    clock = [1_000_000_000]
    local = LocalLimiter(clock=lambda: clock[0])
    tokens = [new_lease_token() for _ in range(3)]
    results = [local.hit_many([("client", [SLOTS, MINUTE])], lease=token)[0] for token in tokens]
    assert [d.allowed for d in results] == [True, True, False]
    assert results[2].policy == "concurrency" and results[2].retry_after == 1.0
    assert {r.policy: r.remaining for r in results[1].results} == {"concurrency": 0, "minute": 3}
    assert local.peek("client", [MINUTE]).remaining == 3  # the refused request charged nothing
    local.release([("client", SLOTS)], tokens[0])
    assert local.hit_many([("client", [SLOTS])], lease=tokens[2])[0].allowed
    clock[0] += 60_000_001  # every lease ran out
    assert local.peek("client", [SLOTS]).remaining == 2
    with pytest.raises(ValueError, match="lease"):
        local.hit("client", [SLOTS])


def test_shares_of_slots_per_app_server() -> None:
    local = LocalLimiter(app_servers=2)
    policy = Policy("concurrency", CONCURRENCY, limit=5, period=60)
    admitted = [local.hit_many([("c", [policy])], lease=new_lease_token())[0].allowed for _ in range(4)]
    assert admitted == [True, True, False, False]  # 5 // 2 slots in this process


def test_a_response_dropped_unclosed_gives_its_slot_back_even_if_collected_inside_a_lock() -> None:
    """The safety net for a response nobody closes: when Python frees it, its slot is given back. A
    garbage collection may free it anywhere, here inside the lock that get_limiter() builds under:
    the request thread goes on at once (the release is queued), and the slot comes back when the
    releasing thread can take the lock."""
    policy = Policy("slots", CONCURRENCY, limit=1, period=60)
    service = get_limiter()
    token = new_lease_token()
    decisions = service.hit_many([("dropped", (policy,))], 1, lease=token)
    slots = slots_taken([("dropped", (policy,))], decisions, token)
    assert slots is not None and service.peek("dropped", [policy]).remaining == 0
    holder = [HttpResponse("never closed")]
    release_with(holder[0], slots)
    dropped = threading.Event()

    def drop_inside_the_lock() -> None:
        cached = service_module._service
        with cached._lock:  # as if a settings reload were building the service right now
            built, cached._value = cached._value, None
            holder.clear()
            gc.collect()
            cached._value = built
            dropped.set()

    worker = threading.Thread(target=drop_inside_the_lock, daemon=True)  # a deadlock must not hang pytest
    worker.start()
    worker.join(10)
    assert dropped.is_set() and not worker.is_alive()
    assert wait_for_value(lambda: get_limiter().peek("dropped", [policy]).remaining, 1, 5.0)


def wait_for_value(read: Callable[[], int], expected: int, seconds: float) -> bool:
    """True once `read()` returns `expected` (polled), False if it has not within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if read() == expected:
            return True
        time.sleep(0.01)
    return read() == expected
