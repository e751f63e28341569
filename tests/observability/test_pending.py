"""ratelimit_app.observability.pending: `add_identity`'s bound, `PendingCounts.size` and `merge` (a batch Redis
could not take, merged back without the hours Redis would have expired) and `write_batches` (what lands
in Redis: hour hashes, daily top sets cut to `keep` with safe labels, each key with its TTL)."""

from __future__ import annotations

import pytest
import redis

from ratelimit_app.observability import pending
from ratelimit_app.observability.pending import PendingCounts, add_identity, write_batches
from ratelimit_app.observability.schema import day_key, hour_key, shadow_day_key

HOUR = 490_000  # hours since the epoch: some day in 2025
DAY = HOUR // 24


def test_add_identity_counts_known_identities_and_refuses_new_ones_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pending, "MAX_PENDING_IDENTITIES", 2)
    counts: dict[tuple[int, str], int] = {}
    assert add_identity(counts, (DAY, "ip:1")) and add_identity(counts, (DAY, "ip:2"), 5)
    assert not add_identity(counts, (DAY, "ip:3"))
    assert add_identity(counts, (DAY, "ip:1"), 2)  # a known identity is always counted
    assert counts == {(DAY, "ip:1"): 3, (DAY, "ip:2"): 5}


def batch(prefix: str = "rl") -> PendingCounts:
    counts = PendingCounts(prefix)
    counts.counts = {(HOUR, "free", "none", "allowed", False): 7, (HOUR - 5, "free", "minute", "blocked", False): 2}
    counts.blocked = {(DAY, "ip:192.0.2.1"): 2}
    counts.shadow = {(HOUR, "free", "dry"): 4, (HOUR - 5, "free", "dry"): 1}
    counts.shadow_identities = {(DAY, "ip:192.0.2.1"): 5}
    return counts


def test_size_is_the_decisions_counted() -> None:
    assert PendingCounts("rl").size() == 0
    assert batch().size() == 9


def test_merge_adds_what_redis_could_not_take_and_drops_what_it_would_have_expired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    current = PendingCounts("rl")
    current.counts = {(HOUR, "free", "none", "allowed", False): 1}
    current.blocked = {(DAY, "ip:192.0.2.9"): 1}
    monkeypatch.setattr(pending, "MAX_PENDING_IDENTITIES", 1)
    dropped = current.merge(batch(), oldest_hour=HOUR - 4)
    assert current.counts == {(HOUR, "free", "none", "allowed", False): 8}
    assert dropped == 2 + 2  # an expired hour's 2 decisions, and 2 blocks of an identity over the bound
    assert current.blocked == {(DAY, "ip:192.0.2.9"): 1}
    assert current.shadow == {(HOUR, "free", "dry"): 4}  # the expired hour's would-be refusal is gone too
    assert current.shadow_identities == {(DAY, "ip:192.0.2.1"): 5}
    assert current.size() == 8


def test_write_batches_adds_every_prefix_in_one_go(redis_client: redis.Redis, key_prefix: str) -> None:
    first, second = batch(f"{key_prefix}:a"), batch(f"{key_prefix}:b")
    write_batches(redis_client, {"a": first, "b": second}, ttl=600, keep=10)
    write_batches(redis_client, {"a": first}, ttl=600, keep=10)  # added to, not replaced
    for prefix, times in ((f"{key_prefix}:a", 2), (f"{key_prefix}:b", 1)):
        hour = redis_client.hgetall(hour_key(prefix, HOUR))
        assert hour == {b"allowed": b"%d" % (7 * times), b"tier:free:allowed": b"%d" % (7 * times),
                        b"shadow:free:dry": b"%d" % (4 * times)}
        earlier = redis_client.hgetall(hour_key(prefix, HOUR - 5))
        assert earlier[b"policy:minute:blocked"] == b"%d" % (2 * times)
        assert redis_client.zscore(day_key(prefix, DAY), "ip:192.0.2.1") == 2 * times
        assert redis_client.zscore(shadow_day_key(prefix, DAY), "ip:192.0.2.1") == 5 * times
        for key in (hour_key(prefix, HOUR), day_key(prefix, DAY), shadow_day_key(prefix, DAY)):
            assert 590 < redis_client.ttl(key) <= 600


def test_a_days_top_set_keeps_its_highest_and_never_a_keys_secret(redis_client: redis.Redis, key_prefix: str) -> None:
    counts = PendingCounts(key_prefix)
    counts.blocked = {(DAY, f"ip:192.0.2.{n}"): n for n in range(1, 8)}
    counts.blocked[(DAY, "key:abcd1234.the-secret")] = 3
    counts.blocked[(DAY, "key:abcd1234.another-secret")] = 3  # the same key: one label, counted together
    write_batches(redis_client, {key_prefix: counts}, ttl=600, keep=3)
    top = redis_client.zrevrange(day_key(key_prefix, DAY), 0, -1, withscores=True)
    assert top == [(b"ip:192.0.2.7", 7.0), (b"key:abcd1234", 6.0), (b"ip:192.0.2.6", 6.0)]
