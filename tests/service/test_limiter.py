"""ratelimit_app.service.limiter: `LimiterService` and `get_limiter`. How the engine is built (lazily, once,
again after a failure), releases that never raise for Redis, resets that forget locally even when Redis
is down and announce themselves, bad input that raises rather than follows the fail mode, one service
per settings, and `call_redis` (a caller's own small command, within the budget, never past an open
breaker)."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from devtools.embedded import RedisProcess, free_port
from ratelimit_app import BackendError, Policy, RateLimiter, new_lease_token
from ratelimit_app.service.breaker import CircuitBreaker
from ratelimit_app.service.connection import build_client
from ratelimit_app.service.denycache import reset_epoch_key
from ratelimit_app.service.fallback import LocalLimiter
from ratelimit_app.service.guard import RedisGuard
from ratelimit_app.service.limiter import LimiterService, get_limiter

MINUTE = (Policy("minute", "fixed_window", limit=2, period=60),)
SLOT = (Policy("inflight", "concurrency", limit=1, period=30),)


def unreachable(key_prefix: str) -> RateLimiter:
    """An engine whose Redis refuses every connection."""
    client = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    return RateLimiter(client, prefix=key_prefix)


def test_the_engine_is_built_on_first_use_once_however_many_threads_ask(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    built: list[RateLimiter] = []

    def build() -> RateLimiter:
        built.append(RateLimiter(redis_client, prefix=key_prefix))
        return built[-1]

    service = LimiterService(build)
    assert built == []
    start = threading.Barrier(16)

    def decide() -> None:
        start.wait()
        service.hit("client", (Policy("big", "fixed_window", limit=100, period=60),))

    threads = [threading.Thread(target=decide) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 1 and service.limiter() is built[0]
    assert service.peek("client", (Policy("big", "fixed_window", limit=100, period=60),)).remaining == 84


def test_an_engine_that_cannot_be_built_is_an_outage_and_is_built_again_on_the_next_call(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    attempts: list[int] = []

    def build() -> RateLimiter:
        attempts.append(1)
        if len(attempts) == 1:
            raise BackendError("no cluster node answered", maybe_applied=False)
        return RateLimiter(redis_client, prefix=key_prefix)

    service = LimiterService(build, fail_mode="closed")
    first = service.hit("client", MINUTE)
    assert not first.allowed and first.degraded and service.stats().redis_failures == 1
    second = service.hit("client", MINUTE)
    assert second.allowed and not second.degraded and second.remaining == 1
    assert len(attempts) == 2


def test_bad_input_raises_instead_of_following_the_fail_mode(redis_client: redis.Redis, key_prefix: str) -> None:
    service = LimiterService(RateLimiter(redis_client, prefix=key_prefix), fail_mode="open")
    with pytest.raises(ValueError, match="cost"):
        service.hit("client", MINUTE, cost=0)
    with pytest.raises(ValueError, match="lease"):
        service.hit_many([("client", SLOT)])
    with pytest.raises(ValueError, match="fail_mode"):
        service.hit("client", MINUTE, fail_mode="ajar")
    stats = service.stats()
    assert stats.redis_failures == 0 and stats.degraded == 0


def test_bad_input_during_the_probe_lets_the_next_call_probe(redis_client: redis.Redis, key_prefix: str) -> None:
    now = [1000.0]
    breaker = CircuitBreaker(1, 5.0, 10.0, clock=lambda: now[0])
    service = LimiterService(RateLimiter(redis_client, prefix=key_prefix), breaker=breaker, fail_mode="closed")
    breaker.record_failure("down")
    now[0] += 5.0
    with pytest.raises(ValueError, match="cost"):
        service.hit("client", MINUTE, cost=-1)  # took the probe, asked nothing
    decision = service.hit("client", MINUTE)  # the next caller probes, and Redis answers
    assert decision.allowed and not decision.degraded and breaker.state == "closed"


def test_peek_answers_a_cached_denial_unless_fresh(redis_client: redis.Redis, key_prefix: str) -> None:
    service = LimiterService(RateLimiter(redis_client, prefix=key_prefix))
    for _ in range(3):
        service.hit("client", MINUTE)
    assert service.stats().deny_cache_size == 1
    hits = service.stats().deny_cache_hits
    assert not service.peek("client", MINUTE).allowed and service.stats().deny_cache_hits == hits + 1
    fresh = service.peek("client", MINUTE, fresh=True)
    assert not fresh.allowed and service.stats().deny_cache_hits == hits + 1  # Redis was asked
    assert service.peek("client", MINUTE).remaining == 0  # a peek charges nothing


def test_release_gives_slots_back_and_says_false_when_redis_cannot_be_asked(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    service = LimiterService(RateLimiter(redis_client, prefix=key_prefix))
    lease = new_lease_token()
    assert service.hit("client", SLOT, lease=lease).allowed
    assert service.release([("client", SLOT[0])], lease) is True
    assert service.hit("client", SLOT, lease=new_lease_token()).allowed  # the slot was free again
    down = LimiterService(unreachable(key_prefix))
    assert down.release([("client", SLOT[0])], lease) is False
    assert down.stats().redis_failures == 1
    for _ in range(down.guard.breaker.failures):
        down.release([("client", SLOT[0])], lease)
    assert down.guard.breaker.state == "open"
    failures = down.stats().redis_failures
    assert down.release([("client", SLOT[0])], lease) is False and down.stats().redis_failures == failures


def test_renew_says_whether_every_slot_was_held_and_none_when_redis_cannot_be_asked(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    service = LimiterService(RateLimiter(redis_client, prefix=key_prefix))
    held = [("client", SLOT[0])]
    lease = new_lease_token()
    assert service.hit("client", SLOT, lease=lease).allowed
    assert service.renew(held, lease, 1000) is True and service.renew(held, lease) is True
    assert service.release(held, lease) is True
    assert service.renew(held, lease) is False  # given back: not taken again
    assert service.hit("client", SLOT, lease=new_lease_token()).allowed
    down = LimiterService(unreachable(key_prefix))
    assert down.renew(held, lease) is None and down.stats().redis_failures == 1
    for _ in range(down.guard.breaker.failures):
        down.renew(held, lease)
    failures = down.stats().redis_failures
    assert down.guard.breaker.state == "open"
    assert down.renew(held, lease) is None and down.stats().redis_failures == failures  # Redis not asked
    with pytest.raises(ValueError):
        service.renew(held, "not a token")  # bad input raises, as a decision's does


def test_slots_the_local_fail_mode_took_are_given_back_in_process(key_prefix: str) -> None:
    service = LimiterService(unreachable(key_prefix), fail_mode="local", fallback=LocalLimiter(app_servers=1))
    lease = new_lease_token()
    taken = service.hit("client", SLOT, lease=lease)
    assert taken.allowed and taken.degraded
    assert not service.hit("client", SLOT, lease=new_lease_token()).allowed
    assert service.renew([("client", SLOT[0])], lease, 1000, local=True) is True
    assert service.release([("client", SLOT[0])], lease, local=True) is True
    assert service.hit("client", SLOT, lease=new_lease_token()).allowed
    # they live in the process that took them, where a renewal may not arrive: it is never refused for it
    assert service.renew([("client", SLOT[0])], "elsewhere", local=True) is True


def test_reset_clears_redis_announces_itself_and_forgets_locally_even_when_redis_is_down(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    service = LimiterService(RateLimiter(redis_client, prefix=key_prefix))
    for _ in range(3):
        service.hit("client", MINUTE)
    service.reset("client", MINUTE)
    assert redis_client.get(reset_epoch_key(key_prefix)) is not None
    assert service.stats().deny_cache_size == 0 and service.hit("client", MINUTE).remaining == 1
    down = LimiterService(unreachable(key_prefix), fail_mode="local", fallback=LocalLimiter(app_servers=1))
    for _ in range(3):
        down.hit("client", MINUTE)
    assert not down.hit("client", MINUTE).allowed
    with pytest.raises(BackendError):
        down.reset("client", MINUTE)
    assert down.hit("client", MINUTE).allowed  # the local state was forgotten anyway


def test_services_may_share_one_guard(redis_client: redis.Redis, key_prefix: str) -> None:
    guard = RedisGuard()
    first = LimiterService(RateLimiter(redis_client, prefix=key_prefix), guard=guard)
    second = LimiterService(RateLimiter(redis_client, prefix=key_prefix), guard=guard)
    for _ in range(3):
        first.hit("client", MINUTE)
    hits = second.stats().deny_cache_hits
    assert not second.hit("client", MINUTE).allowed and second.stats().deny_cache_hits == hits + 1
    with pytest.raises(TypeError, match="not both"):
        LimiterService(guard=guard, fail_mode="open")


def test_get_limiter_is_one_service_per_settings(settings: Any, server: RedisProcess, key_prefix: str) -> None:
    service = get_limiter()
    assert get_limiter() is service
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url, "FAIL_MODE": "closed",
                          "KEY_PREFIX": f"{key_prefix}-other"}
    rebuilt = get_limiter()
    assert rebuilt is not service and rebuilt.guard.fail_mode == "closed"
    assert rebuilt.hit("client", MINUTE).remaining == 1
    private = redis.Redis(port=server.port)
    assert private.keys(f"{key_prefix}-other:*")  # the new settings' Redis and prefix
    private.close()


def test_call_redis_runs_one_command_of_the_callers_within_the_budget(
        redis_client: redis.Redis, key_prefix: str, server: RedisProcess) -> None:
    service = LimiterService(RateLimiter(redis_client, prefix=key_prefix))
    marker = f"{key_prefix}:marker"
    assert service.call_redis(lambda client: client.set(marker, "1", ex=60))
    assert service.call_redis(lambda client: client.get(marker)) == b"1"
    assert service.stats().breaker.state == "closed" and service.stats().redis_failures == 0  # not a decision
    hung = LimiterService(RateLimiter(build_client(server.url), prefix=key_prefix), budget_ms=300)
    hung.call_redis(lambda client: client.ping())  # connected before the server stops
    server.process.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        hung.call_redis(lambda client: client.get(marker))
    assert time.monotonic() - started < 0.3 + 0.5  # the budget, and a loaded machine's margin
    assert hung.stats().breaker.state == "closed"  # the breaker is the decisions' to move


def test_call_redis_sends_nothing_while_the_breaker_is_open(redis_client: redis.Redis, key_prefix: str) -> None:
    service = LimiterService(RateLimiter(redis_client, prefix=key_prefix), breaker=CircuitBreaker(1, 60, 60))
    service.guard.breaker.record_failure(ConnectionError("down"))
    sent: list[Any] = []
    with pytest.raises(BackendError, match="breaker is open"):
        service.call_redis(lambda client: sent.append(client))
    assert sent == []
