"""The limiter keeps serving when Redis is stopped, paused, black-holed, loses replies or restarts
empty; the circuit breaker; fail modes; the local deny cache.

Every outage happens to a redis-server this test starts (or to a TCP proxy in front of it), never to
the shared Redis. Latency bounds are correctness bounds (no request hangs), measured around service
calls with a tolerance for a loaded CI box: p99 <= BUDGET_MS + 100 ms, and no call over 1 s.
"""

from __future__ import annotations

import json
import logging
import socket
import statistics
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis

from devtools.embedded import RedisProcess, start_redis
from ratelimit_app import Decision, Policy, PolicyResult, RateLimiter
from ratelimit_app.core.scripts import decide_source
from ratelimit_app.observability.recorder import flush
from ratelimit_app.observability.snapshot import breaker_state
from ratelimit_app.service.denycache import RESET_CHECK_INTERVAL, DenyCache
from ratelimit_app.service.limiter import LimiterService, get_limiter
from tests.support.limits_support import attempts
from tests.support.tcp_proxy import TcpProxy, tcp_proxy
from tests.support.topology import command_calls, run_threads, wait_for

BUDGET_MS = 50
P99_BOUND = (BUDGET_MS + 100) / 1000
MAX_BOUND = 1.0
DAY = [Policy("day", "sliding_window", limit=10, period=86400)]




@pytest.fixture
def admin(server: RedisProcess) -> Iterator[redis.Redis]:
    """A client of the private server for assertions (not the limiter's)."""
    client = redis.Redis(port=server.port, socket_timeout=10)
    yield client
    client.close()


@pytest.fixture
def proxy(server: RedisProcess) -> Iterator[TcpProxy]:
    with tcp_proxy("127.0.0.1", server.port) as running:
        yield running


def configure(settings: Any, url: str, **overrides: Any) -> LimiterService:
    """Point the limiter at `url` with production-like timeouts (the suite's defaults are generous)."""
    settings.RATELIMIT = {
        **settings.RATELIMIT, "REDIS_URL": url, "BUDGET_MS": BUDGET_MS, "SOCKET_CONNECT_TIMEOUT": 0.05,
        "SOCKET_TIMEOUT": 0.05, "BREAKER_FAILURES": 3, "BREAKER_COOLDOWN": 0.2, "BREAKER_MAX_COOLDOWN": 1.0,
        **overrides,
    }
    return get_limiter()


def warm(service: LimiterService, port: int) -> None:
    """Load the script and open a connection first: a cold first call (connect, NOSCRIPT, SCRIPT LOAD)
    on a busy machine could spend the 50 ms budget before the outage under test even begins."""
    client = redis.Redis(port=port, socket_timeout=10)
    client.script_load(decide_source())
    client.close()
    wait_for(lambda: not service.hit("warm-up", DAY).degraded, 10, "a first decision within the budget")


def timed(call: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def assert_within_budget(durations: list[float]) -> None:
    p99 = statistics.quantiles(durations, n=100)[98] if len(durations) >= 2 else durations[0]
    assert p99 <= P99_BOUND, f"p99 limiter time {p99 * 1000:.1f} ms over the {BUDGET_MS} ms budget (+100 ms)"
    assert max(durations) <= MAX_BOUND, f"a call took {max(durations):.3f} s: it hung on Redis"


def follows(mode: str, decision: Decision) -> bool:
    """True when `decision` is what `mode` answers without Redis (local: see test_local_mode_*)."""
    if mode == "open":
        return decision.allowed and decision.degraded
    if mode == "closed":
        return (not decision.allowed and decision.degraded and decision.retry_after is not None
                and decision.retry_after > 0)
    return decision.degraded or (not decision.allowed and decision.retry_after is not None)


def engine_peek(port: int, prefix: str, policies: list[Policy]) -> Decision:
    client = redis.Redis(port=port, socket_timeout=10)
    try:
        return RateLimiter(client, prefix=prefix).peek("k", policies)
    finally:
        client.close()


# -- Redis stopped mid-traffic ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["open", "closed", "local"])
def test_redis_stopped_mid_traffic_follows_the_fail_mode_within_the_budget(
        settings: Any, server: RedisProcess, mode: str) -> None:
    service = configure(settings, server.url, FAIL_MODE=mode, APP_SERVERS=2)
    warm(service, server.port)
    durations = []
    for n in range(5):
        decision, took = timed(lambda: service.hit("k", DAY))
        durations.append(took)
        assert decision.allowed and not decision.degraded and decision.remaining == 9 - n
    server.stop()
    outage = []
    for _ in range(200):
        decision, took = timed(lambda: service.hit("k", DAY))
        outage.append(decision)
        durations.append(took)
    assert_within_budget(durations)
    assert all(follows(mode, d) for d in outage)
    if mode == "local":
        # the local share of a 10/day limit on 2 servers is 5: this server admits 5 more, then denies
        # like a rate limit (429), not like an outage (503)
        assert [d.allowed for d in outage] == [True] * 5 + [False] * 195
        assert all(d.degraded for d in outage[:5]) and not any(d.degraded for d in outage[5:])
    stats = service.stats()
    assert stats.degraded == 200
    assert stats.breaker.state == "open" and stats.breaker.opened == 1


def test_local_mode_divides_every_policy_by_the_app_servers(settings: Any, server: RedisProcess) -> None:
    service = configure(settings, server.url, FAIL_MODE="local", APP_SERVERS=4)
    server.stop()
    tier = [Policy("burst", "token_bucket", limit=20, period=60, burst=8),
            Policy("minute", "sliding_window", limit=20, period=60)]
    decisions = [service.hit("key:abc", tier) for _ in range(5)]
    # 20/min over 4 servers: the bucket holds 8 // 4 = 2 and refills one token every 12 s
    assert [d.allowed for d in decisions] == [True, True, False, False, False]
    denied = decisions[-1]
    assert denied.policy == "burst" and denied.retry_after == pytest.approx(12.0, abs=0.5)
    assert [r.remaining for r in decisions[1].results] == [0, 3]  # the window's share is 5


def test_a_tier_may_override_the_fail_mode_per_call(settings: Any, server: RedisProcess) -> None:
    service = configure(settings, server.url, FAIL_MODE="open")
    server.stop()
    assert service.hit("k", DAY).allowed
    refused = service.hit("k", DAY, fail_mode="closed")
    assert not refused.allowed and refused.degraded and refused.retry_after
    assert service.hit_many([("ip:1", DAY), ("k", DAY)], fail_mode="local")[0].allowed
    with pytest.raises(ValueError, match="fail_mode"):
        service.hit("k", DAY, fail_mode="sometimes")
    for mode in ("open", "closed", "local"):  # bad input is refused alike with Redis down
        with pytest.raises(ValueError, match="cost"):
            service.hit("k", DAY, cost=0, fail_mode=mode)
        with pytest.raises(ValueError, match="identity"):
            service.hit("", DAY, fail_mode=mode)


def test_a_cluster_that_cannot_be_reached_at_start_is_an_outage_not_a_crash(settings: Any) -> None:
    from devtools.embedded import free_port

    service = configure(settings, f"redis+cluster://127.0.0.1:{free_port()}", FAIL_MODE="closed")
    decision = service.hit("k", DAY)
    assert not decision.allowed and decision.degraded


# -- black hole, pause, lost replies: nothing hangs, nothing is charged twice -----------------------

@pytest.mark.parametrize("mode", ["open", "closed"])
def test_a_black_holed_redis_is_answered_within_the_budget(settings: Any, server: RedisProcess,
                                                           proxy: TcpProxy, admin: redis.Redis, mode: str) -> None:
    # socket timeouts far above the budget: the budget alone must bound the wait
    service = configure(settings, proxy.url, FAIL_MODE=mode, SOCKET_TIMEOUT=5.0, SOCKET_CONNECT_TIMEOUT=5.0)
    warm(service, server.port)
    assert service.hit("k", DAY).remaining == 9
    proxy.mode = "black_hole"
    durations = []
    for _ in range(100):
        decision, took = timed(lambda: service.hit("k", DAY))
        durations.append(took)
        assert follows(mode, decision)
    assert_within_budget(durations)
    # nothing reached Redis, so nothing was charged
    proxy.mode = "forward"
    assert engine_peek(server.port, settings.RATELIMIT["KEY_PREFIX"], DAY).remaining == 9


def test_a_connect_that_never_completes_is_bounded_by_the_budget(settings: Any) -> None:
    """A listener whose backlog is full: SYNs go unanswered, so connecting hangs until the timeout."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(8):  # fill the accept queue (never accepted)
        filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    try:
        service = configure(settings, f"redis://127.0.0.1:{port}/0", FAIL_MODE="closed", SOCKET_TIMEOUT=5.0,
                            SOCKET_CONNECT_TIMEOUT=5.0, BREAKER_FAILURES=100)
        durations = []
        for _ in range(5):
            decision, took = timed(lambda: service.hit("k", DAY))
            durations.append(took)
            assert not decision.allowed and decision.degraded
        assert_within_budget(durations)
    finally:
        for sock in [*fillers, listener]:
            sock.close()


def test_a_paused_redis_is_answered_within_the_budget_and_charges_once(
        settings: Any, server: RedisProcess, admin: redis.Redis) -> None:
    service = configure(settings, server.url, FAIL_MODE="closed", BREAKER_FAILURES=1000)
    prefix = settings.RATELIMIT["KEY_PREFIX"]
    warm(service, server.port)
    base = command_calls(admin, "evalsha")
    assert service.hit("k", DAY).remaining == 9
    admin.execute_command("CLIENT PAUSE", 1500, "ALL")
    durations = []
    for _ in range(5):
        decision, took = timed(lambda: service.hit("k", DAY))
        durations.append(took)
        assert follows("closed", decision)
    assert_within_budget(durations)
    # the pause ends by itself (CLIENT UNPAUSE would wait for it like any other command)
    after = wait_for(lambda: (d := service.hit("k", DAY)) and not d.degraded and d, 10, "Redis to answer again")
    # Every EVALSHA Redis executed charged exactly one unit: the ones sent during the pause either ran
    # after it (their replies were lost) or were dropped with their connection, never resent.
    executed = command_calls(admin, "evalsha") - base
    assert after.remaining == 10 - executed
    assert engine_peek(server.port, prefix, DAY).remaining == 10 - executed
    assert 2 <= executed <= 2 + 5


def test_replies_lost_after_sending_never_charge_twice(settings: Any, server: RedisProcess, proxy: TcpProxy,
                                                       admin: redis.Redis) -> None:
    service = configure(settings, proxy.url, FAIL_MODE="open", BREAKER_FAILURES=1000)
    prefix = settings.RATELIMIT["KEY_PREFIX"]
    warm(service, server.port)
    base, base_sent = command_calls(admin, "evalsha"), proxy.commands_seen("EVALSHA")
    for _ in range(2):
        assert not service.hit("k", DAY).degraded
    proxy.mode = "drop_replies"  # every EVALSHA reaches Redis and is charged there; its reply is lost
    durations = []
    for _ in range(4):
        decision, took = timed(lambda: service.hit("k", DAY))
        durations.append(took)
        assert decision.allowed and decision.degraded
    assert_within_budget(durations)
    proxy.mode = "forward"
    assert engine_peek(server.port, prefix, DAY).remaining == 10 - 2 - 4  # each request charged once
    assert command_calls(admin, "evalsha") - base == 2 + 4 + 1  # and sent once (+1: the peek just now)
    assert proxy.commands_seen("EVALSHA") - base_sent == 2 + 4


def test_redis_restarted_empty_is_recovered_silently_and_charges_once(settings: Any,
                                                                      server: RedisProcess) -> None:
    # a budget no busy machine spends: what is under test is the recovery (reconnect, NOSCRIPT, SCRIPT LOAD,
    # the call once more) and the single charge, not how fast they are
    service = configure(settings, server.url, FAIL_MODE="closed", BUDGET_MS=5000, SOCKET_TIMEOUT=5.0,
                        SOCKET_CONNECT_TIMEOUT=2.0)
    prefix = settings.RATELIMIT["KEY_PREFIX"]
    for _ in range(3):
        service.hit("k", DAY)
    server.stop()
    restarted = start_redis(port=server.port)  # no keys, no scripts, same address
    try:
        decision = service.hit("k", DAY)
        assert decision.allowed and not decision.degraded and decision.remaining == 9
        assert engine_peek(restarted.port, prefix, DAY).remaining == 9
        stats = service.stats()
        assert stats.redis_failures == 0 and stats.degraded == 0 and stats.breaker.state == "closed"
    finally:
        restarted.stop()


# -- the circuit breaker ----------------------------------------------------------------------------

def breaker_events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [getattr(record, "ratelimit", {})["state"] for record in caplog.records
            if getattr(record, "ratelimit_event", None) == "ratelimit.breaker" and record.levelno >= logging.INFO]


def test_breaker_opens_skips_redis_probes_once_and_closes(settings: Any, server: RedisProcess, proxy: TcpProxy,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    service = configure(settings, proxy.url, FAIL_MODE="closed")
    warm(service, server.port)
    # the breaker's time moves only when the test says so: however slow the machine, the cool-downs
    # below end exactly where the test ends them
    now = [0.0]  # (from 0: the retry times below come out exact, 0.2 is 0.2)
    breaker = service.guard.breaker
    breaker.clock = lambda: now[0]
    assert not service.hit("k", DAY).degraded
    caplog.clear()
    proxy.mode = "black_hole"
    for _ in range(3):
        assert service.hit("k", DAY).degraded
    assert breaker.state == "open"
    sent = proxy.commands_seen("EVALSHA")
    connections = proxy.connections
    # open: 500 decisions without a byte to Redis
    for _ in range(500):
        refused = service.hit("k", DAY)
        assert follows("closed", refused) and (refused.retry_after or 0) <= 0.2
    assert (proxy.commands_seen("EVALSHA"), proxy.connections) == (sent, connections)
    assert service.stats().breaker.cooldown == 0.2
    # half-open: once the cool-down the breaker reports has passed, 16 concurrent requests send one probe
    now[0] += breaker.retry_in()
    probes = run_threads(16, lambda _: service.hit("k", DAY))
    assert all(follows("closed", d) for d in probes)
    assert proxy.commands_seen("EVALSHA") == sent + 1
    assert service.stats().breaker.cooldown == 0.4  # the probe failed: the cool-down doubles ...
    now[0] += breaker.retry_in()
    service.hit("k", DAY)
    assert service.stats().breaker.cooldown == 0.8
    now[0] += breaker.retry_in()
    service.hit("k", DAY)
    assert service.stats().breaker.cooldown == 1.0  # ... up to BREAKER_MAX_COOLDOWN
    # Redis answers again: the next probe closes the breaker and limiting is normal at once
    proxy.mode = "forward"
    now[0] += breaker.retry_in()
    decision = service.hit("k", DAY)
    assert decision.allowed and not decision.degraded and decision.remaining == 8
    assert breaker.state == "closed"
    assert not service.hit("k", DAY).degraded
    # each state change logged once, however many requests passed through each state
    assert breaker_events(caplog) == ["open", "half_open", "open", "half_open", "open", "half_open", "open",
                                      "half_open", "closed"]
    assert breaker_state() == "closed"
    stats = service.stats()
    assert stats.degraded_closed == 3 + 500 + 16 + 2 and stats.degraded == stats.degraded_closed
    assert stats.breaker.opened == 1


# -- the local deny cache ---------------------------------------------------------------------------

def all_commands(client: redis.Redis) -> int:
    """Commands the server has run, not counting the INFO calls that ask."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info")


def test_a_denied_hot_identity_floods_without_a_redis_command_until_its_retry_time(
        settings: Any, server: RedisProcess, admin: redis.Redis) -> None:
    service = configure(settings, server.url, BUDGET_MS=5000, SOCKET_TIMEOUT=5.0, SOCKET_CONNECT_TIMEOUT=2.0)
    prefix = settings.RATELIMIT["KEY_PREFIX"]
    policies = [Policy("burst", "sliding_window", limit=3, period=4)]
    for _ in range(3):
        assert service.hit("key:hot", policies).allowed
    denied = service.hit("key:hot", policies)
    assert not denied.allowed and not denied.degraded and denied.retry_after is not None
    retry_at = time.monotonic() + denied.retry_after
    # the first answer from the deny cache reads the reset epoch for the first time, which counts as a
    # reset (one may have come since the denial): it asks Redis once more, and caches the denial again
    assert not service.hit("key:hot", policies).allowed
    flush()  # nothing else may talk to this server during the flood
    before, gets, started = all_commands(admin), command_calls(admin, "get"), time.monotonic()
    flood = [service.hit("key:hot", policies) for _ in range(10_000)]
    elapsed = time.monotonic() - started
    assert all(not d.allowed and not d.degraded and 0 < (d.retry_after or 0) <= denied.retry_after for d in flood)
    assert flood[-1].policy == "burst" and flood[-1].limit == 3
    # no decision reached Redis; only the reset epoch was read, at most once per RESET_CHECK_INTERVAL
    epoch_reads = command_calls(admin, "get") - gets
    assert all_commands(admin) - before == epoch_reads, "the flood reached Redis"
    assert epoch_reads <= elapsed / RESET_CHECK_INTERVAL + 1
    assert time.monotonic() < retry_at, "the flood outlasted the retry time; the test proves nothing"
    assert service.stats().deny_cache_hits == 10_000 + 1
    # Redis agrees it was denied the whole time
    assert not engine_peek_identity(server.port, prefix, "key:hot", policies).allowed
    time.sleep(max(retry_at - time.monotonic(), 0))
    calls = command_calls(admin, "evalsha")
    assert service.hit("key:hot", policies).allowed  # at its retry time it goes to Redis again
    assert command_calls(admin, "evalsha") == calls + 1


def engine_peek_identity(port: int, prefix: str, identity: str, policies: list[Policy]) -> Decision:
    client = redis.Redis(port=port, socket_timeout=10)
    try:
        return RateLimiter(client, prefix=prefix).peek(identity, policies)
    finally:
        client.close()


def test_the_deny_cache_never_denies_what_redis_would_allow(settings: Any, server: RedisProcess) -> None:
    service = configure(settings, server.url, BUDGET_MS=5000, SOCKET_TIMEOUT=5.0, SOCKET_CONNECT_TIMEOUT=2.0)
    policies = [Policy("p", "fixed_window", limit=4, period=3600)]
    for _ in range(3):
        assert service.hit("key:a", policies).allowed
    assert not service.hit("key:a", policies, cost=2).allowed  # cached: key:a at cost 2
    assert service.hit("key:a", policies, cost=1).allowed  # another cost is another request
    assert service.hit("key:b", policies, cost=2).allowed  # another identity too
    ip = [Policy("ip", "sliding_window", limit=100, period=60)]
    refused = service.hit_many([("ip:1", ip), ("key:a", policies)])
    assert [d.allowed for d in refused] == [False, False]
    assert service.hit("ip:1", ip).allowed  # the IP was refused for the key's sake only
    service.reset("key:a", policies)  # a reset frees the identity at once in this process
    assert service.hit("key:a", policies, cost=2).allowed


def test_a_denial_decided_before_a_reset_is_not_cached_after_it() -> None:
    cache = DenyCache(10)
    denial = Decision(False, 3, 0, 4.0, 4.0, "burst", (), False)
    generation = cache.generation  # read when the request is sent ...
    cache.forget("key:a")  # ... a reset (here or announced by another process) lands meanwhile ...
    cache.remember(("k",), ("key:a",), [denial], time.monotonic(), generation)  # ... then the reply
    assert len(cache) == 0
    cache.remember(("k",), ("key:a",), [denial], time.monotonic(), cache.generation)
    assert len(cache) == 1


def test_a_cached_denial_is_shifted_by_whole_milliseconds_never_early_shadow_included() -> None:
    cache = DenyCache(10)
    burst = PolicyResult("burst", False, 3, 0, 4.0, 4.0)
    dry = PolicyResult("dry", False, 1, 0, 9.0, 9.0)
    denial = Decision(False, 3, 0, 4.0, 4.0, "burst", (burst,), False, (dry,))
    cache.remember(("k",), ("key:a",), [denial], 100.0)
    [later] = cache.get(("k",), 101.2347) or []
    # 1.2347 s later: shifted by 1.234 s, never below the exact 2.7653 s (a client is never early)
    assert later.retry_after == pytest.approx(2.766) and later.results[0].retry_after == pytest.approx(2.766)
    assert later.reset_after == pytest.approx(2.766) and later.results[0].remaining == 0
    assert later.shadow[0].retry_after == pytest.approx(7.766) and later.would_block == ("dry",)


def test_lookups_within_one_millisecond_share_one_shifted_denial() -> None:
    cache = DenyCache(10)
    denial = Decision(False, 3, 0, 4.0, 4.0, "burst", (PolicyResult("burst", False, 3, 0, 4.0, 4.0),), False)
    cache.remember(("k",), ("key:a",), [denial], 100.0)
    first, same = cache.get(("k",), 100.5001), cache.get(("k",), 100.5009)
    assert first is not None and same is not None and first is not same  # each caller its own list ...
    assert same[0] is first[0]  # ... of the same (immutable) decision, made once for the millisecond
    after = cache.get(("k",), 100.5012)
    assert after is not None and after[0] is not first[0] and after[0].retry_after == pytest.approx(3.499)
    # a denial remembered again is a new entry: never answered with the old one's shifted copy
    cache.remember(("k",), ("key:a",), [denial], 100.5)
    again = cache.get(("k",), 100.5012)
    assert again is not None and again[0].retry_after == pytest.approx(3.999)
    assert cache.hits == 4


def test_the_deny_cache_is_bounded(settings: Any, server: RedisProcess) -> None:
    service = configure(settings, server.url, DENY_CACHE_SIZE=50, BUDGET_MS=5000, SOCKET_TIMEOUT=5.0)
    policies = [Policy("p", "gcra", limit=1, period=3600)]
    for n in range(200):
        assert service.hit(f"key:{n}", policies).allowed
        assert not service.hit(f"key:{n}", policies).allowed
    assert len(service.guard.deny_cache) == 50
    assert not service.hit("key:199", policies).allowed  # recent denials are kept; old ones asked again
    assert not service.hit("key:0", policies).allowed


def test_the_cache_alias_client_gets_the_limiters_timeouts_and_budget(settings: Any) -> None:
    """REDIS_URL None: the django-redis cache's server, but the limiter's own pool (its cache may retry)."""
    from ratelimit_app.core.redispy import BudgetConnection
    from ratelimit_app.service.connection import get_redis

    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": None, "CACHE_ALIAS": "default", "BUDGET_MS": 50,
                          "SOCKET_TIMEOUT": 5.0, "SOCKET_CONNECT_TIMEOUT": 5.0}
    client = get_redis()
    assert isinstance(client, redis.Redis)
    pool = client.connection_pool
    assert pool.connection_class is BudgetConnection
    kwargs = pool.connection_kwargs
    assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (0.05, 0.05)
    assert attempts(kwargs["retry"]) == 1
    assert not get_limiter().hit("k", DAY).degraded


# -- the "pool" path: a bounded pool whose callers wait ----------------------------------------------

def test_the_pool_path_shares_a_bounded_pool_and_every_decision_is_exact(settings: Any, server: RedisProcess,
                                                                        admin: redis.Redis) -> None:
    """RATELIMIT['CONNECTIONS'] = "pool": 8 threads deciding through max_connections=2 wait their turn
    for a connection (none fails for want of one), and Redis sees 2 connections at most."""
    from ratelimit_app.core.redispy import BudgetBlockingConnectionPool
    from ratelimit_app.service.connection import get_redis

    service = configure(settings, f"{server.url}?max_connections=2", CONNECTIONS="pool", BUDGET_MS=5000,
                        SOCKET_TIMEOUT=5.0, SOCKET_CONNECT_TIMEOUT=5.0)
    pool = cast(redis.Redis, get_redis()).connection_pool
    assert isinstance(pool, BudgetBlockingConnectionPool) and pool.max_connections == 2
    before = int(admin.info("stats")["total_connections_received"])
    limit = [Policy("hour", "sliding_window", limit=100, period=3600)]
    decisions = run_threads(8, lambda i: [service.hit("shared", limit) for _ in range(25)])
    flat = [d for per_thread in decisions for d in per_thread]
    assert not any(d.degraded for d in flat)
    assert sum(d.allowed for d in flat) == 100 and len(flat) == 200
    assert int(admin.info("stats")["total_connections_received"]) - before <= 2


def test_the_pool_path_waits_for_a_free_connection_no_longer_than_the_budget(settings: Any,
                                                                            server: RedisProcess) -> None:
    from ratelimit_app.service.connection import get_redis

    service = configure(settings, f"{server.url}?max_connections=1", CONNECTIONS="pool", FAIL_MODE="closed")
    warm(service, server.port)
    pool = cast(redis.Redis, get_redis()).connection_pool
    try:
        held = pool.get_connection()
    except TypeError:  # redis-py 5 wants a command name
        held = pool.get_connection("PING")
    try:
        decision, took = timed(lambda: service.hit("k", DAY))
        assert follows("closed", decision)  # no connection within the budget: the fail mode answers
        assert_within_budget([took])
    finally:
        pool.release(held)
    assert not service.hit("k", DAY).degraded


def test_the_cache_alias_client_on_the_pool_path_is_bounded(settings: Any) -> None:
    from ratelimit_app.core.redispy import BudgetBlockingConnectionPool
    from ratelimit_app.service.connection import POOL_MAX_CONNECTIONS, get_redis

    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": None, "CACHE_ALIAS": "default", "CONNECTIONS": "pool"}
    pool = cast(redis.Redis, get_redis()).connection_pool
    assert isinstance(pool, BudgetBlockingConnectionPool) and pool.max_connections == POOL_MAX_CONNECTIONS
    assert not get_limiter().hit("k", DAY).degraded


def redis_events(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(record.levelname, record.getMessage()) for record in caplog.records
            if getattr(record, "ratelimit_event", "").startswith("ratelimit.redis_")]


@pytest.mark.parametrize(("mode", "requests"), [("open", "admitted without limits"),
                                                ("closed", "refused with 503"),
                                                ("local", "limited by each process alone")])
def test_the_log_says_when_redis_stops_answering_where_why_what_requests_get_and_when_it_is_back(
        settings: Any, server: RedisProcess, proxy: TcpProxy, caplog: pytest.LogCaptureFixture,
        mode: str, requests: str) -> None:
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    service = configure(settings, proxy.url, FAIL_MODE=mode)
    warm(service, server.port)
    now = [0.0]
    breaker = service.guard.breaker
    breaker.clock = lambda: now[0]
    caplog.clear()
    proxy.mode = "black_hole"
    for _ in range(3):
        assert service.hit("k", DAY).degraded
    now[0] += breaker.retry_in()
    service.hit("k", DAY)  # a probe that fails: still down, nothing more to say
    proxy.mode = "forward"
    now[0] += breaker.retry_in() + 12.5
    assert not service.hit("k", DAY).degraded
    where = f"127.0.0.1:{proxy.port}"
    assert redis_events(caplog) == [
        ("WARNING", f"ratelimit.redis_unavailable redis={where} error=TimeoutError fail_mode={mode} "
                    f"requests={json.dumps(requests + ' until Redis answers')}"),
        ("INFO", f"ratelimit.redis_available redis={where} outage_seconds={round(now[0], 3)}"),
    ]
