"""ratelimit_app.core.engine_sync: `RateLimiter`, the synchronous transport, on both of its paths. What it
accepts, how many round trips its calls cost (counted on a redis-server of the test's own), releases and
their errors, resets of nothing, `close`, and a connection that failed being made again."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from devtools.embedded import RedisProcess, free_port
from ratelimit_app import BackendError, Policy, RateLimiter, new_lease_token
from ratelimit_app.core import engine_sync
from ratelimit_app.core.engine_sync import resolve_connections
from ratelimit_app.core.scripts import decide_source
from tests.support.topology import wait_for

MINUTE = (Policy("minute", "fixed_window", limit=3, period=60),)
SLOT = Policy("inflight", "concurrency", limit=2, period=30)


@pytest.fixture
def admin(server: RedisProcess) -> Iterator[redis.Redis]:
    """The test's own client of the private server, with the decision script loaded."""
    client = redis.Redis(port=server.port)
    client.script_load(decide_source())
    yield client
    client.close()


def sent_by_clients(server: RedisProcess, action: Callable[[], object]) -> list[str]:
    """The commands clients sent to the server while `action` ran (MONITOR: not those run inside scripts)."""
    commands: list[str] = []
    marker = redis.Redis(port=server.port)
    marker.ping()  # its connection (and handshake) before the count starts
    with redis.Redis(port=server.port).monitor() as monitor:
        action()
        marker.execute_command("ECHO", "end-of-action")
        for event in monitor.listen():
            if event["command"] == "ECHO end-of-action":
                break
            if event["client_type"] != "lua":
                commands.append(event["command"].split()[0])
    marker.close()
    return commands


def test_what_it_accepts() -> None:
    with pytest.raises(TypeError, match="expected a redis.Redis or redis.cluster.RedisCluster, got Redis"):
        RateLimiter(redis.asyncio.Redis())  # type: ignore[arg-type]  # AsyncRateLimiter takes this one
    with pytest.raises(TypeError, match="got str"):
        RateLimiter("redis://127.0.0.1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="connections: 'threads' is not one of auto, own, pool"):
        RateLimiter(redis.Redis(), connections="threads")
    with pytest.raises(ValueError, match="prefix"):
        RateLimiter(redis.Redis(), prefix="has space")
    assert [resolve_connections(mode) for mode in ("own", "pool", "auto")] == ["own", "pool", "own"]


def test_deciding_several_identities_is_one_round_trip_and_all_or_nothing(
    server: RedisProcess, admin: redis.Redis, connections: str
) -> None:
    limiter = RateLimiter(redis.Redis(port=server.port), prefix="t", connections=connections)
    tight = (Policy("tight", "fixed_window", limit=1, period=60),)
    limiter.hit("warm-up", MINUTE)  # the connection is opened first
    decided: list[bool] = []
    sent = sent_by_clients(server, lambda: decided.extend(
        d.allowed for d in limiter.hit_many([("ip:1", MINUTE), ("key:a", tight)])))
    assert sent == ["EVALSHA"] and decided == [True, True]
    refused = limiter.hit_many([("ip:1", MINUTE), ("key:a", tight)])
    assert [d.allowed for d in refused] == [False, False]
    assert limiter.peek("ip:1", MINUTE).remaining == 2  # the refusal charged the IP nothing


def test_release_is_one_round_trip_for_every_slot_and_frees_only_that_lease(
    server: RedisProcess, admin: redis.Redis, connections: str
) -> None:
    limiter = RateLimiter(redis.Redis(port=server.port), prefix="t", connections=connections)
    mine, other = new_lease_token(), new_lease_token()
    assert all(d.allowed for d in limiter.hit_many([("ip:1", (SLOT,)), ("key:a", (SLOT,))], lease=mine))
    assert limiter.hit("key:a", (SLOT,), lease=other).allowed
    assert sent_by_clients(server, lambda: limiter.release([("ip:1", SLOT), ("key:a", SLOT)], mine)) == \
        ["ZREM", "ZREM"]
    [ip_key] = limiter.keys("ip:1", (SLOT,))
    [key_key] = limiter.keys("key:a", (SLOT,))
    assert admin.zcard(ip_key) == 0 and admin.zrange(key_key, 0, -1) == [other.encode()]
    assert sent_by_clients(server, lambda: limiter.release([], mine)) == []  # nothing held: nothing sent
    assert sent_by_clients(server, lambda: limiter.reset("key:a", ())) == []  # no policies: nothing sent


def test_a_release_redis_cannot_take_raises_and_says_nothing_was_applied_when_nothing_was_sent(
    key_prefix: str, connections: str
) -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    limiter = RateLimiter(client, prefix=key_prefix, connections=connections)
    with pytest.raises(BackendError, match="could not release slots of lease 'lease-1'") as raised:
        limiter.release([("key:a", SLOT)], "lease-1")
    assert raised.value.maybe_applied is False  # the connection was refused: no ZREM reached Redis


def test_keys_follow_the_policies_order(key_prefix: str, redis_client: redis.Redis) -> None:
    limiter = RateLimiter(redis_client, prefix=key_prefix)
    day = Policy("day", "fixed_window", limit=100, period=86400)
    shared, slot_key, shared_again = limiter.keys("key:a", (MINUTE[0], SLOT, day))
    assert shared == shared_again != slot_key
    assert all(key.startswith(f"{key_prefix}:") for key in (shared, slot_key))
    assert limiter.keys("key:b", (MINUTE[0],)) != [shared]


def test_close_lets_go_of_the_connections_and_the_next_call_opens_one(server: RedisProcess, admin: redis.Redis) -> None:
    limiter = RateLimiter(redis.Redis(port=server.port), prefix="t", connections="own")
    limiter.hit("k", MINUTE)
    assert len(admin.client_list()) == 2
    limiter.close()
    wait_for(lambda: len(admin.client_list()) == 1, 5.0, "the connection to close")
    assert limiter.hit("k", MINUTE).remaining == 1
    limiter.close()
    limiter.close()  # twice: nothing left to close, no error


def test_a_connection_that_failed_is_closed_and_made_again_on_next_use(
    server: RedisProcess, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_sync, "IDLE_CHECK_AFTER", 3600.0)  # never checked before use: it must fail
    limiter = RateLimiter(redis.Redis(port=server.port), prefix="t", connections="own")
    limiter.hit("k", MINUTE)
    assert admin.client_kill_filter(_type="normal", skipme=True) == 1
    wait_for(lambda: len(admin.client_list()) == 1, 5.0, "the kill")
    with pytest.raises(BackendError, match="Redis failed"):
        limiter.hit("k", MINUTE)
    received = int(admin.info("stats")["total_connections_received"])
    decision = limiter.hit("k", MINUTE)
    assert decision.allowed and decision.remaining in (0, 1)  # the lost call may or may not have run
    assert int(admin.info("stats")["total_connections_received"]) == received + 1
