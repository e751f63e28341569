"""Counts recorded in this process and not yet in Redis, and how a batch of them is written.

The recorder keeps one `PendingCounts` per key prefix and hands them to `write_batches` on each flush;
when Redis cannot take them, it merges them back (`merge`), dropping what Redis would have expired.
At most MAX_PENDING_IDENTITIES distinct identities are kept per batch (memory bound while Redis is down).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..service.logs import safe_identity
from .schema import day_key, decision_fields, hour_key, shadow_day_key, shadow_field

#: Distinct blocked identities kept per unflushed batch (memory bound while Redis is down).
MAX_PENDING_IDENTITIES = 10_000

# (hour, tier, policy, outcome, degraded) -> decisions; outcome is one of recorder.OUTCOMES
_CountKey = tuple[int, str, str, str, bool]
# (day, identity label as given) -> blocked decisions
_IdentityKey = tuple[int, str]
# (hour, tier, policy) -> requests a shadow limit would have refused
_ShadowKey = tuple[int, str, str]


def add_identity(counts: dict[_IdentityKey, int], key: _IdentityKey, count: int = 1) -> bool:
    """Add `count` to `key`; False (nothing added) when `key` is new and MAX_PENDING_IDENTITIES are kept."""
    seen = counts.get(key)
    if seen is not None:
        counts[key] = seen + count
    elif len(counts) < MAX_PENDING_IDENTITIES:
        counts[key] = count
    else:
        return False
    return True


class PendingCounts:
    """Counts not yet in Redis, for one key prefix."""

    __slots__ = ("blocked", "counts", "prefix", "shadow", "shadow_identities")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.counts: dict[_CountKey, int] = {}
        self.blocked: dict[_IdentityKey, int] = {}
        self.shadow: dict[_ShadowKey, int] = {}
        self.shadow_identities: dict[_IdentityKey, int] = {}

    def size(self) -> int:
        """Decisions counted in this batch."""
        return sum(self.counts.values())

    def merge(self, old: PendingCounts, oldest_hour: int) -> int:
        """Add the counts of `old`, a batch Redis could not take, except hours before `oldest_hour`;
        returns how many decisions were dropped (expired hours, or identities over the bound)."""
        dropped = 0
        for count_key, count in old.counts.items():
            if count_key[0] < oldest_hour:
                dropped += count  # would have expired in Redis already
            else:
                self.counts[count_key] = self.counts.get(count_key, 0) + count
        for blocked_key, count in old.blocked.items():
            if not add_identity(self.blocked, blocked_key, count):
                dropped += count
        for shadow_key, count in old.shadow.items():
            if shadow_key[0] >= oldest_hour:
                self.shadow[shadow_key] = self.shadow.get(shadow_key, 0) + count
        for identity_key, count in old.shadow_identities.items():
            add_identity(self.shadow_identities, identity_key, count)
        return dropped


def _add_daily_top(pipe: Any, counts: dict[_IdentityKey, int], key_of: Callable[[str, int], str], prefix: str,
                   keep: int, ttl: int) -> None:
    """Add per-day identity counts to each day's top set (identity labels made safe), keeping its `keep`
    highest and its TTL: the top blocked and the top would-be-blocked identities alike."""
    days: dict[int, dict[str, int]] = {}
    for (day, identity), count in counts.items():
        members = days.setdefault(day, {})
        label = safe_identity(identity)
        members[label] = members.get(label, 0) + count
    for day, members in days.items():
        key = key_of(prefix, day)
        for label, count in members.items():
            pipe.zincrby(key, count, label)
        pipe.zremrangebyrank(key, 0, -(keep + 1))
        pipe.expire(key, ttl)


def _hour_fields(batch: PendingCounts) -> dict[int, dict[str, int]]:
    """hour -> field of the hour's hash -> what to add to it."""
    hours: dict[int, dict[str, int]] = {}
    for (hour, tier, policy, outcome, degraded), count in batch.counts.items():
        fields = hours.setdefault(hour, {})
        for name in decision_fields(tier, policy, outcome, degraded):
            fields[name] = fields.get(name, 0) + count
    for (hour, tier, policy), count in batch.shadow.items():
        fields = hours.setdefault(hour, {})
        name = shadow_field(tier, policy)
        fields[name] = fields.get(name, 0) + count
    return hours


def write_batches(client: Any, batches: dict[str, PendingCounts], *, ttl: int, keep: int) -> None:
    """Add `batches` to Redis in one pipeline: hour hashes and daily top sets, each key with `ttl` seconds
    to live, each top set cut to its `keep` highest. Raises what the client raises."""
    from redis.cluster import RedisCluster

    # One MULTI/EXEC on a single Redis: a batch lands whole or not at all. Every metrics key shares
    # the {metrics} hash tag, yet cluster pipelines are sent without a transaction.
    pipe = client.pipeline(transaction=not isinstance(client, RedisCluster))
    for batch in batches.values():
        for hour, fields in _hour_fields(batch).items():
            key = hour_key(batch.prefix, hour)
            for name, count in fields.items():
                pipe.hincrby(key, name, count)
            pipe.expire(key, ttl)
        _add_daily_top(pipe, batch.blocked, day_key, batch.prefix, keep, ttl)
        _add_daily_top(pipe, batch.shadow_identities, shadow_day_key, batch.prefix, keep, ttl)
    pipe.execute()
