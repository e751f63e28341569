"""Concurrency slots nobody could give back while Redis did not answer are given back once it does.

The outages happen to a redis-server of the test's own (SIGSTOP/SIGCONT) or to a TCP proxy in front of
it, never to the shared Redis. "Live" leases are counted in Redis itself: members of a policy's sorted
set whose score (the lease's end) is still ahead of Redis' clock.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from devtools.embedded import RedisProcess
from ratelimit_app import RateLimiter
from ratelimit_app.core.engine import new_lease_token
from ratelimit_app.core.policies import CONCURRENCY, Policy
from ratelimit_app.service import lostleases
from ratelimit_app.service.limiter import LimiterService
from ratelimit_app.service.lostleases import LostLease, LostLeases
from tests.service.test_resilience import configure, warm
from tests.support.tcp_proxy import tcp_proxy
from tests.support.topology import command_calls, run_threads

SLOTS = Policy("concurrency", CONCURRENCY, limit=2, period=30)
#: the load shedder's fleet count is a concurrency policy too, decided in the same call
FLEET = Policy("shed", CONCURRENCY, limit=4, period=60)
CHECKS = [("key:abc", [SLOTS]), ("shed:fleet", [FLEET])]


@pytest.fixture
def admin(server: RedisProcess) -> Iterator[redis.Redis]:
    client = redis.Redis(port=server.port, socket_timeout=10)
    yield client
    client.close()


def live_leases(admin: redis.Redis, prefix: str, identity: str, policy: Policy) -> int:
    """Leases of `identity` under `policy` that hold a slot now, read from Redis."""
    [key] = RateLimiter(admin, prefix=prefix).keys(identity, [policy])
    seconds, micros = admin.time()
    return int(admin.zcount(key, f"({seconds * 1_000_000 + micros}", "+inf"))


def slots_free(admin: redis.Redis, prefix: str) -> tuple[int, int]:
    return (SLOTS.limit - live_leases(admin, prefix, "key:abc", SLOTS),
            FLEET.limit - live_leases(admin, prefix, "shed:fleet", FLEET))


def test_decisions_run_by_a_paused_redis_when_it_resumes_leave_no_slot_behind(
        settings: Any, server: RedisProcess, admin: redis.Redis) -> None:
    service = configure(settings, server.url, FAIL_MODE="open", BREAKER_FAILURES=1000)
    prefix = settings.RATELIMIT["KEY_PREFIX"]
    warm(service, server.port)
    base = command_calls(admin, "evalsha")
    server.process.send_signal(signal.SIGSTOP)
    try:
        # 8 requests at once: each sent its decision, waited out the budget, went on with the fail mode
        decisions = run_threads(8, lambda _: service.hit_many(CHECKS, lease=new_lease_token()))
        assert all(d.allowed and d.degraded for pair in decisions for d in pair)
        assert len(service.guard.lost_leases) == 8
    finally:
        server.process.send_signal(signal.SIGCONT)
    # Redis ran the decisions waiting in its sockets when it resumed (their clients had gone): without
    # the cancellations those would hold 2 slots of the key and 4 places of the fleet for their leases
    assert service.guard.lost_leases.settled(10)
    assert command_calls(admin, "evalsha") - base >= 1
    assert slots_free(admin, prefix) == (2, 4)
    admitted = [service.hit_many(CHECKS, lease=new_lease_token()) for _ in range(3)]
    assert [pair[0].allowed for pair in admitted] == [True, True, False]  # exactly the 2 slots


def test_a_decision_whose_reply_is_dropped_gives_its_slot_back_once_replies_flow(
        settings: Any, server: RedisProcess, admin: redis.Redis) -> None:
    with tcp_proxy("127.0.0.1", server.port) as proxy:
        service = configure(settings, proxy.url, FAIL_MODE="open", BREAKER_FAILURES=1000)
        prefix = settings.RATELIMIT["KEY_PREFIX"]
        warm(service, server.port)
        stop = _blocking_attempts(service)
        proxy.mode = "drop_replies"  # the decision reaches Redis and takes its slots; the reply is lost
        decision = service.hit_many(CHECKS, lease=new_lease_token())
        assert decision[0].allowed and decision[0].degraded
        assert slots_free(admin, prefix) == (1, 3)  # taken in Redis, held by no request
        proxy.mode = "forward"
        stop.set()
        assert service.guard.lost_leases.settled(10)
        assert slots_free(admin, prefix) == (2, 4)


def _blocking_attempts(service: LimiterService) -> threading.Event:
    """Hold the service's lost-lease attempts until the returned event is set (so the test can see the
    slot held in Redis before it is given back)."""
    go = threading.Event()
    settle = service.guard._settle

    def held_back(lost: LostLease) -> bool:
        go.wait(10)
        return settle(lost)

    service.guard.lost_leases._attempt = held_back
    return go


def test_a_cancellation_that_runs_before_the_decision_leaves_no_slot(
        redis_client: redis.Redis, key_prefix: str) -> None:
    limiter = RateLimiter(redis_client, prefix=key_prefix)
    lost = new_lease_token()
    limiter.cancel([("key:abc", SLOTS)], lost)  # Redis runs the cancellation first ...
    assert limiter.hit("key:abc", [SLOTS], lease=lost).allowed  # ... then the decision: it takes nothing
    assert live_leases(redis_client, key_prefix, "key:abc", SLOTS) == 0
    taken = [limiter.hit("key:abc", [SLOTS], lease=new_lease_token()).allowed for _ in range(3)]
    assert taken == [True, True, False]
    [key] = limiter.keys("key:abc", [SLOTS])
    assert 29_000 < redis_client.pttl(key) <= 30_000


def test_a_cancellation_after_the_decision_frees_its_slot(redis_client: redis.Redis, key_prefix: str) -> None:
    limiter = RateLimiter(redis_client, prefix=key_prefix)
    lost, kept = new_lease_token(), new_lease_token()
    assert limiter.hit("key:abc", [SLOTS], lease=lost).allowed
    assert limiter.hit("key:abc", [SLOTS], lease=kept).allowed
    limiter.cancel([("key:abc", SLOTS)], lost)
    limiter.cancel([("key:abc", SLOTS)], lost)  # twice: the other lease is untouched
    assert live_leases(redis_client, key_prefix, "key:abc", SLOTS) == 1
    assert limiter.hit("key:abc", [SLOTS], lease=new_lease_token()).allowed
    assert not limiter.hit("key:abc", [SLOTS], lease=new_lease_token()).allowed


def test_a_cancelled_lease_is_trimmed_once_it_has_ended(redis_client: redis.Redis, key_prefix: str) -> None:
    short = Policy("concurrency", CONCURRENCY, limit=2, period=1)
    limiter = RateLimiter(redis_client, prefix=key_prefix)
    [key] = limiter.keys("key:abc", [short])
    limiter.cancel([("key:abc", short)], "gone")
    members: list[tuple[bytes, float]] = redis_client.zrange(key, 0, -1, withscores=True)  # type: ignore[assignment]
    [(member, score)] = members
    assert member == b"gone" and score < 0
    end = -score
    while _redis_now(redis_client) <= end:
        pass  # Redis' clock, read until the cancelled lease has ended
    assert limiter.hit("key:abc", [short], lease=new_lease_token()).allowed
    assert redis_client.zscore(key, "gone") is None and redis_client.zcard(key) == 1


def _redis_now(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1_000_000 + micros


def test_a_release_redis_could_not_take_is_sent_again_when_it_answers(
        settings: Any, server: RedisProcess, admin: redis.Redis) -> None:
    service = configure(settings, server.url, FAIL_MODE="open", BREAKER_FAILURES=1000)
    prefix = settings.RATELIMIT["KEY_PREFIX"]
    warm(service, server.port)
    token = new_lease_token()
    assert not service.hit_many(CHECKS, lease=token)[0].degraded
    held = [("key:abc", SLOTS), ("shed:fleet", FLEET)]
    server.process.send_signal(signal.SIGSTOP)
    try:
        assert service.release(held, token) is False  # the budget ran out
        assert len(service.guard.lost_leases) == 1
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert service.guard.lost_leases.settled(10)
    assert slots_free(admin, prefix) == (2, 4)


def test_a_release_is_dropped_once_its_lease_has_run_out() -> None:
    attempts: list[str] = []

    def redis_never_answers(lost: LostLease) -> bool:
        attempts.append(lost.lease)
        return False

    leases = LostLeases(redis_never_answers, lambda: 0.01)
    leases.release([("key:abc", Policy("concurrency", CONCURRENCY, limit=1, period=0.2))], "t")
    assert leases.settled(10)  # given up once the lease's 0.2 s were over, having tried meanwhile
    assert attempts and set(attempts) == {"t"}


def test_lost_leases_are_bounded_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lostleases, "MAX_PENDING", 3)
    sending, go = threading.Event(), threading.Event()
    done: list[str] = []

    def attempt(lost: LostLease) -> bool:
        sending.set()
        go.wait(10)
        done.append(lost.lease)
        return True

    leases = LostLeases(attempt, lambda: 0.01)
    leases.cancel([("key:abc", SLOTS)], "a")
    assert sending.wait(10)  # "a" is being sent
    for token in "bcde":
        leases.cancel([("key:abc", SLOTS)], token)
    go.set()
    assert leases.settled(10)
    # "d" pushed "a" (already on its way) out of the list, "e" pushed "b": "b" is the one lost
    assert done == ["a", "c", "d", "e"]
