"""How the sync engine talks to a standalone Redis: on the speed path one connection per thread (and per
process), no pool checkout; on the reference path ("pool") connections of the client's own pool.

Each test runs against its own redis-server, so connection counts are exact.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import redis

from devtools.embedded import RedisProcess
from ratelimit_app import Policy, RateLimiter
from ratelimit_app.core.engine_sync import IDLE_CHECK_AFTER, MAX_SHELVED, green_threads
from ratelimit_app.core.scripts import decide_source
from tests.support.topology import run_threads, wait_for

MINUTE = [Policy("minute", "fixed_window", limit=1000, period=60)]




def admin_of(server: RedisProcess) -> redis.Redis:
    """A client of the test itself, with the decision script loaded (no NOSCRIPT round trips to count)."""
    admin = redis.Redis(port=server.port)
    admin.script_load(decide_source())
    return admin


def connections_received(admin: redis.Redis) -> int:
    return int(admin.info("stats")["total_connections_received"])


def test_each_thread_decides_over_one_connection_of_its_own(server: RedisProcess) -> None:
    admin = admin_of(server)
    limiter = RateLimiter(redis.Redis(port=server.port), prefix="t")
    before = connections_received(admin)
    run_threads(6, lambda i: [limiter.hit(f"client:{i}", MINUTE) for _ in range(50)])
    assert connections_received(admin) - before == 6
    assert limiter.peek("client:0", MINUTE).remaining == 950
    # the client's own pool was never asked for a connection by the engine
    assert limiter.client.connection_pool._created_connections == 0  # type: ignore[union-attr]


def test_a_forked_child_makes_its_own_connection_and_the_parent_keeps_its_own(server: RedisProcess) -> None:
    limiter = RateLimiter(redis.Redis(port=server.port), prefix="t")
    assert limiter.hit("k", MINUTE).remaining == 999
    pid = os.fork()
    if pid == 0:  # the child: a decision of its own over a new connection, then out without cleanup
        code = 0 if limiter.hit("k", MINUTE).remaining == 998 else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert limiter.hit("k", MINUTE).remaining == 997  # the parent's connection was not disturbed


def test_a_connection_the_server_closed_while_idle_is_replaced_before_use(server: RedisProcess) -> None:
    admin = admin_of(server)
    limiter = RateLimiter(redis.Redis(port=server.port), prefix="t")
    limiter.hit("k", MINUTE)
    killed = admin.client_kill_filter(_type="normal", skipme=True)
    assert killed == 1  # the engine's connection
    wait_for(lambda: len(admin.client_list()) == 1, 5.0, "the kill")
    before = connections_received(admin)
    time.sleep(2 * IDLE_CHECK_AFTER)  # idle for longer than that: checked before use, found closed, replaced
    decision = limiter.hit("k", MINUTE)
    assert decision.allowed and decision.remaining == 998
    assert connections_received(admin) - before == 1


def test_a_client_that_decodes_responses_still_gets_exact_decisions(server: RedisProcess) -> None:
    """The script's reply is binary; the engine reads it undecoded whatever the client's decode_responses."""
    limiter = RateLimiter(redis.Redis(port=server.port, decode_responses=True), prefix="t")
    small = [Policy("burst", "token_bucket", limit=3, period=60)]
    assert [limiter.hit("k", small).allowed for _ in range(4)] == [True, True, True, False]
    assert limiter.peek("k", small).remaining == 0


def hit_together(limiter: RateLimiter, identity: str, decided: threading.Barrier) -> None:
    """One decision, then wait until every thread of `decided` has made its own: each thread holds its
    connection at the same time (none ends early and leaves its connection to another)."""
    limiter.hit(identity, MINUTE)
    decided.wait()


def test_threads_that_end_leave_their_connections_to_new_threads(server: RedisProcess) -> None:
    """A server that runs each request in a thread of its own (Django's ASGI handler, for sync code)
    reuses the connections of threads that ended instead of opening one per request."""
    admin = admin_of(server)
    limiter = RateLimiter(redis.Redis(port=server.port), prefix="t")
    decided = threading.Barrier(4)
    before = connections_received(admin)
    run_threads(4, lambda i: hit_together(limiter, f"client:{i}", decided))
    assert connections_received(admin) - before == 4
    for n in range(20):  # 20 requests, each in a new thread that ends after it
        worker = threading.Thread(target=limiter.hit, args=(f"request:{n}", MINUTE))
        worker.start()
        worker.join()
    assert connections_received(admin) - before == 4  # the four threads' connections, reused
    assert limiter.peek("request:19", MINUTE).remaining == 999
    limiter.close()  # this thread's connection and the idle ones
    wait_for(lambda: len(admin.client_list()) == 1, 5.0, "the idle connections to close")


def test_at_most_max_shelved_idle_connections_are_kept(server: RedisProcess) -> None:
    admin = admin_of(server)
    limiter = RateLimiter(redis.Redis(port=server.port), prefix="t")
    decided = threading.Barrier(MAX_SHELVED + 6)
    run_threads(MAX_SHELVED + 6, lambda i: hit_together(limiter, f"client:{i}", decided))
    # the threads have ended: MAX_SHELVED of their connections are kept, the others closed
    wait_for(lambda: len(admin.client_list()) == 1 + MAX_SHELVED, 5.0, "the extra connections to close")
    limiter.close()
    wait_for(lambda: len(admin.client_list()) == 1, 5.0, "the idle connections to close")


def test_the_pool_path_stays_within_the_clients_pool(server: RedisProcess) -> None:
    """8 threads deciding through a pool of 3: never more than 3 connections, every decision exact."""
    admin = admin_of(server)
    pool = redis.BlockingConnectionPool(port=server.port, max_connections=3, timeout=10)
    limiter = RateLimiter(redis.Redis(connection_pool=pool), prefix="t", connections="pool")
    assert limiter.connections == "pool"
    before = connections_received(admin)
    run_threads(8, lambda i: [limiter.hit(f"client:{i % 2}", MINUTE) for _ in range(50)])
    assert connections_received(admin) - before <= 3
    assert [limiter.peek(f"client:{i}", MINUTE).remaining for i in range(2)] == [800, 800]
    pool.disconnect()


def test_auto_takes_the_own_path_unless_threads_are_green(server: RedisProcess) -> None:
    # this test process has no gevent or eventlet monkey-patching
    assert not green_threads()
    assert RateLimiter(redis.Redis(port=server.port), prefix="t").connections == "own"


def test_redis_location_names_hosts_and_ports_never_credentials(settings: Any) -> None:
    from ratelimit_app.service.connection import redis_location, redis_location_of

    assert redis_location_of("redis://:s3cret@10.0.0.5:6380/2") == "10.0.0.5:6380"
    assert redis_location_of("rediss://user:pw@cache.internal/0?password=x") == "cache.internal:6379"
    assert redis_location_of("redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7000") == "10.0.0.1:7000,10.0.0.2:7000"
    assert redis_location_of("unix:///run/redis.sock?db=1") == "/run/redis.sock"
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": None, "CACHE_ALIAS": "limits"}
    settings.CACHES = {**settings.CACHES, "limits": {"BACKEND": "django_redis.cache.RedisCache",
                                                     "LOCATION": "redis://:pw@10.0.0.9:6379/1"}}
    assert redis_location() == "10.0.0.9:6379"
