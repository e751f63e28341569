"""A long sliding log (limit >= LONG_LOG_UNITS) keeps its units in a key of its own, appended to by each
hit, with a hint in the identity's key of where its live units start (lua/sliding_window.lua).

Every test counts what a client sees (admitted, remaining, retry_after) and what Redis holds (the
key's units, its TTL), against a real Redis."""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from ratelimit_app import Policy, RateLimiter
from ratelimit_app.core.algorithms import BY_NAME
from ratelimit_app.core.engine import prepare_call
from ratelimit_app.core.keys import state_entries

#: The limit from which a sliding log has a key of its own.
LONG = BY_NAME["sliding_window"].long_state_from
#: The limit of most tests here: a long log with room for the logs they write.
LIMIT = 8 * LONG
MINUTE = 60_000_000  # us


def long_policy(limit: int = LIMIT) -> list[Policy]:
    return [Policy("minute", "sliding_window", limit=limit, period=60)]


def identity_key(limiter: RateLimiter, identity: str = "k") -> str:
    return prepare_call(limiter.prefix, ((identity, long_policy()),), 1, charge=False).keys[0]


def hint(client: redis.Redis, key: str) -> tuple[int, int, int]:
    """(head, newest unit in us, the key's expiry in ms) of the long log's entry in the identity's key."""
    value = client.get(key)
    assert isinstance(value, bytes)
    state = state_entries(value)["sminute"][1]
    assert len(state) == 20 and state[:1] == b"L", state
    _, head, newest, expiry = struct.unpack(">c6s7s6s", state)
    return int.from_bytes(head, "big"), int.from_bytes(newest, "big"), int.from_bytes(expiry, "big")


def units(*admitted_us: int) -> bytes:
    return b"".join(t.to_bytes(7, "big") for t in admitted_us)


def hint_entry(head: int, newest: int, key_expiry_ms: int, expiry_ms: int) -> bytes:
    state = b"L" + head.to_bytes(6, "big") + newest.to_bytes(7, "big") + key_expiry_ms.to_bytes(6, "big")
    return struct.pack(">B", 7) + b"sminute" + struct.pack(">QI", expiry_ms, len(state))[2:] + state


def now_us(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1_000_000 + micros


@pytest.fixture
def log(limiter: RateLimiter) -> tuple[str, str]:
    """(the identity's key, the long log's own key) of identity "k"."""
    [own] = limiter.keys("k", long_policy())
    return identity_key(limiter), own


def test_a_long_log_admits_exactly_its_limit_and_appends_its_units_to_a_key_of_its_own(
    limiter: RateLimiter, redis_client: redis.Redis, log: tuple[str, str]
) -> None:
    identity, own = log
    assert own != identity
    assert limiter.hit("k", long_policy(), cost=LIMIT - 10).remaining == 10
    assert redis_client.strlen(own) == 7 * (LIMIT - 10)
    admitted = [limiter.hit("k", long_policy()).allowed for _ in range(15)]
    assert admitted == [True] * 10 + [False] * 5
    assert redis_client.strlen(own) == 7 * LIMIT  # one 7-byte admission time per unit, appended
    head, newest, key_expiry = hint(redis_client, identity)
    assert head == 0 and abs(newest - now_us(redis_client)) < 5_000_000
    # the key outlives its newest unit (its expiry moves once a period), and the entry lives as long as it
    assert 0 < redis_client.pttl(own) <= 120_001 and key_expiry >= newest // 1000 + 60_000
    denied = limiter.hit("k", long_policy())
    assert not denied.allowed and denied.remaining == 0 and 55 < (denied.retry_after or 0) <= 60
    assert limiter.peek("k", long_policy()).remaining == 0


def test_units_that_left_the_window_are_skipped_through_the_hint_and_trimmed_once_they_are_half(
    limiter: RateLimiter, redis_client: redis.Redis, log: tuple[str, str]
) -> None:
    identity, own = log
    now = now_us(redis_client)
    stale, live = now - 2 * MINUTE, now - MINUTE // 2
    expiry_ms = now // 1000 + 60_000
    # 100 units that left the window, then 300 live ones; the hint says the first 40 are known to be gone
    redis_client.set(own, units(*[stale] * 100, *[live] * 300), px=120_000)
    redis_client.set(identity, hint_entry(40, live, expiry_ms + 60_000, expiry_ms), px=60_000)
    decision = limiter.hit("k", long_policy())
    assert decision.allowed and decision.remaining == LIMIT - 301
    # appended: the stale units stay at the front (fewer than the live ones), and the hint skips them now
    assert redis_client.strlen(own) == 7 * 401
    assert hint(redis_client, identity)[0] == 100
    # 400 stale units before 300 live ones: the charge rewrites the key with the live ones only
    redis_client.set(own, units(*[stale] * 400, *[live] * 300), px=120_000)
    redis_client.set(identity, hint_entry(0, live, expiry_ms + 60_000, expiry_ms), px=60_000)
    assert limiter.hit("k", long_policy(), cost=2).remaining == LIMIT - 302
    assert redis_client.strlen(own) == 7 * 302
    assert redis_client.getrange(own, 0, 7 * 300 - 1) == units(*[live] * 300)
    assert hint(redis_client, identity)[0] == 0
    assert 0 < redis_client.pttl(own) <= 120_001


def test_a_hint_that_does_not_fit_its_key_is_ignored_and_the_log_read_whole(
    limiter: RateLimiter, redis_client: redis.Redis, log: tuple[str, str]
) -> None:
    identity, own = log
    now = now_us(redis_client)
    live = now - MINUTE // 2
    expiry_ms = now // 1000 + 60_000
    # a hint claiming 200 units are gone, when all 300 are live: the count is still 300
    redis_client.set(own, units(*[live] * 300), px=120_000)
    redis_client.set(identity, hint_entry(200, live, expiry_ms + 60_000, expiry_ms), px=60_000)
    assert limiter.peek("k", long_policy()).remaining == LIMIT - 300
    assert limiter.hit("k", long_policy()).remaining == LIMIT - 301
    assert hint(redis_client, identity)[0] == 0
    # a hint past the key's end (the key was evicted and written again): read whole
    redis_client.set(identity, hint_entry(5000, live, expiry_ms + 60_000, expiry_ms), px=60_000)
    assert limiter.hit("k", long_policy()).remaining == LIMIT - 302


def test_a_long_log_whose_key_is_gone_starts_again_with_an_expiring_key(
    limiter: RateLimiter, redis_client: redis.Redis, log: tuple[str, str]
) -> None:
    own = log[1]
    assert limiter.hit("k", long_policy(), cost=5).allowed
    redis_client.delete(own)  # evicted, say: the hint is left without its key
    assert limiter.hit("k", long_policy()).remaining == LIMIT - 1
    assert redis_client.strlen(own) == 7 and 0 < redis_client.pttl(own) <= 120_001


def test_peek_writes_nothing_and_reset_forgets_the_log_and_its_key(
    limiter: RateLimiter, redis_client: redis.Redis, log: tuple[str, str]
) -> None:
    identity, own = log
    assert limiter.hit("k", long_policy(), cost=100).allowed
    before = (redis_client.get(identity), redis_client.get(own))
    assert limiter.peek("k", long_policy()).remaining == LIMIT - 100
    assert (redis_client.get(identity), redis_client.get(own)) == before
    limiter.reset("k", long_policy())
    assert redis_client.exists(own) == 0 and redis_client.exists(identity) == 0
    assert limiter.hit("k", long_policy()).remaining == LIMIT - 1


def test_a_log_keeps_its_count_when_its_limit_moves_across_the_long_log_limit(
    limiter: RateLimiter, redis_client: redis.Redis
) -> None:
    short, long = long_policy(LONG - 1), long_policy(LONG + 1000)
    # raised: the short log in the identity's entry moves to the log's own key
    assert limiter.hit("k", short, cost=100).remaining == LONG - 101
    assert limiter.hit("k", long, cost=10).remaining == LONG + 1000 - 110
    [own] = limiter.keys("k", long)
    assert redis_client.strlen(own) == 7 * 110
    assert limiter.peek("k", long).remaining == LONG + 1000 - 110
    # lowered: every call names a sliding log's own key, so the short log reads the units from it,
    # and its entry replaces the hint
    assert prepare_call(limiter.prefix, (("k", short),), 1, charge=True).keys[1] == own
    assert limiter.peek("k", short).remaining == LONG - 1 - 110
    assert limiter.hit("k", short).remaining == LONG - 1 - 111
    value = redis_client.get(identity_key(limiter))
    assert isinstance(value, bytes) and len(state_entries(value)["sminute"][1]) == 7 * 111
    # and raised once more: the short log is the one that counts (its key is older)
    assert limiter.hit("k", long).remaining == LONG + 1000 - 112


def test_a_lowered_log_whose_key_was_evicted_counts_from_nothing(
    limiter: RateLimiter, redis_client: redis.Redis
) -> None:
    short, long = long_policy(LONG - 1), long_policy(LONG + 1000)
    assert limiter.hit("k", long, cost=50).allowed
    [own] = limiter.keys("k", long)
    redis_client.delete(own)  # evicted: the hint is left without its units
    assert limiter.hit("k", short).remaining == LONG - 2


def test_concurrent_hits_on_a_long_log_admit_exactly_its_limit(
    limiter: RateLimiter, redis_client: redis.Redis, log: tuple[str, str]
) -> None:
    # 64 threads, cost 32 each, race for LIMIT units: exactly LIMIT // 32 are admitted
    with ThreadPoolExecutor(max_workers=32) as pool:
        admitted = sum(pool.map(lambda _: limiter.hit("k", long_policy(), cost=32).allowed, range(64)))
    assert admitted == LIMIT // 32
    assert redis_client.strlen(log[1]) == 7 * LIMIT
