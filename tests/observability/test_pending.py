"""ratelimit_app.observability.pending: `add_identity`'s bound, `PendingCounts.size`, `empty` and `prune` (the
hours Redis would have expired) and `apply_batch` (what lands in Redis: hour hashes, daily top sets cut to
`keep` with safe labels, each key with its TTL; a batch applied once however often it is sent)."""

from __future__ import annotations

import pytest
import redis

from ratelimit_app.observability import pending
from ratelimit_app.observability.pending import PendingCounts, SealedBatch, add_identity, apply_batch
from ratelimit_app.observability.schema import applied_key, day_key, hour_key, shadow_day_key

HOUR = 490_000  # hours since the epoch: some day in 2025
DAY = HOUR // 24


def test_add_identity_counts_known_identities_and_refuses_new_ones_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pending, "_MAX_PENDING_IDENTITIES", 2)
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


def sealed(counts: PendingCounts, number: int = 1, writer: str = "w1") -> SealedBatch:
    return SealedBatch(counts, writer, number, 0.0)


def test_size_is_the_decisions_counted() -> None:
    assert PendingCounts("rl").size() == 0 and PendingCounts("rl").empty()
    assert batch().size() == 9 and not batch().empty()
    only_shadow = PendingCounts("rl")
    only_shadow.shadow_identities = {(DAY, "ip:192.0.2.1"): 1}
    assert only_shadow.size() == 0 and not only_shadow.empty()  # still something to write


def test_prune_drops_what_redis_would_have_expired() -> None:
    counts = batch()
    assert counts.prune(oldest_hour=HOUR - 4) == 2  # the expired hour's 2 decisions
    assert counts.counts == {(HOUR, "free", "none", "allowed", False): 7}
    assert counts.shadow == {(HOUR, "free", "dry"): 4}  # the expired hour's would-be refusal is gone too
    assert counts.blocked == {(DAY, "ip:192.0.2.1"): 2} and counts.shadow_identities == {(DAY, "ip:192.0.2.1"): 5}


def test_a_batch_is_applied_once_however_often_it_is_sent(redis_client: redis.Redis, key_prefix: str) -> None:
    first, second = batch(f"{key_prefix}:a"), batch(f"{key_prefix}:b")
    assert apply_batch(redis_client, sealed(first, 1), ttl=600, keep=10)
    assert apply_batch(redis_client, sealed(second, 2), ttl=600, keep=10)
    for _ in range(3):  # sent again (a timeout, a paused Redis running its queue): nothing is added
        assert not apply_batch(redis_client, sealed(first, 1), ttl=600, keep=10)
    assert apply_batch(redis_client, sealed(first, 3), ttl=600, keep=10)  # a new number: added to, not replaced
    assert not apply_batch(redis_client, sealed(first, 2), ttl=600, keep=10)  # older than the last applied
    assert apply_batch(redis_client, sealed(second, 1, writer="w2"), ttl=600, keep=10)  # another process
    for prefix, times in ((f"{key_prefix}:a", 2), (f"{key_prefix}:b", 2)):
        hour = redis_client.hgetall(hour_key(prefix, HOUR))
        assert hour == {b"allowed": b"%d" % (7 * times), b"tier:free:allowed": b"%d" % (7 * times),
                        b"shadow:free:dry": b"%d" % (4 * times)}
        earlier = redis_client.hgetall(hour_key(prefix, HOUR - 5))
        assert earlier[b"policy:minute:blocked"] == b"%d" % (2 * times)
        assert redis_client.zscore(day_key(prefix, DAY), "ip:192.0.2.1") == 2 * times
        assert redis_client.zscore(shadow_day_key(prefix, DAY), "ip:192.0.2.1") == 5 * times
        for key in (hour_key(prefix, HOUR), day_key(prefix, DAY), shadow_day_key(prefix, DAY)):
            assert 590 < redis_client.ttl(key) <= 600
    assert redis_client.get(applied_key(f"{key_prefix}:a", "w1")) == b"3"
    assert 1190 < redis_client.ttl(applied_key(f"{key_prefix}:a", "w1")) <= 1200  # outlives any resend


def test_a_days_top_set_keeps_its_highest_and_never_a_keys_secret(redis_client: redis.Redis, key_prefix: str) -> None:
    counts = PendingCounts(key_prefix)
    counts.blocked = {(DAY, f"ip:192.0.2.{n}"): n for n in range(1, 8)}
    counts.blocked[(DAY, "key:abcd1234.the-secret")] = 3
    counts.blocked[(DAY, "key:abcd1234.another-secret")] = 3  # the same key: one label, counted together
    apply_batch(redis_client, sealed(counts), ttl=600, keep=3)
    top = redis_client.zrevrange(day_key(key_prefix, DAY), 0, -1, withscores=True)
    assert top == [(b"ip:192.0.2.7", 7.0), (b"key:abcd1234", 6.0), (b"ip:192.0.2.6", 6.0)]
