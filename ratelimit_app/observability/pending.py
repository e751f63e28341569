"""Counts recorded in this process and not yet in Redis (`PendingCounts`), sealed into numbered batches
(`SealedBatch`) that `apply_batch` adds to Redis once, however often one is sent: the applying script records
the writer's last applied number in the same atomic step (docs/observability.md, "Exactly-once batches")."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, NamedTuple

from ..core.logs import safe_identity
from .schema import applied_key, day_key, decision_fields, hour_key, shadow_day_key, shadow_field, usage_field

#: Distinct blocked identities kept per unflushed batch (memory bound while Redis is down).
_MAX_PENDING_IDENTITIES = 10_000

# (hour, tier, policy, outcome, degraded) -> decisions; outcome as recorded (recorder.record)
_CountKey = tuple[int, str, str, str, bool]
# (day, identity label as given) -> blocked decisions
_IdentityKey = tuple[int, str]
# (hour, tier, policy) -> requests a shadow limit would have refused
_ShadowKey = tuple[int, str, str]
# (hour, tier, policy, unit) -> units used under a usage limit
_UsageKey = tuple[int, str, str, str]

# KEYS[1]: the writer's applied marker; KEYS[2..]: the hour hashes ('h') and day sets ('z') to add to.
# ARGV: the batch's number, the marker's TTL, the counters' TTL, how many members a day set keeps, then
# per counter key its kind, its number of (member, amount) pairs and the pairs.
_APPLY_SCRIPT = """
local number = tonumber(ARGV[1])
if (tonumber(redis.call('GET', KEYS[1])) or 0) >= number then
  return 0
end
local keep = tonumber(ARGV[4])
local at = 5
for index = 2, #KEYS do
  local key, kind, count = KEYS[index], ARGV[at], tonumber(ARGV[at + 1])
  at = at + 2
  for _ = 1, count do
    if kind == 'h' then
      redis.call('HINCRBY', key, ARGV[at], ARGV[at + 1])
    else
      redis.call('ZINCRBY', key, ARGV[at + 1], ARGV[at])
    end
    at = at + 2
  end
  if kind == 'z' then
    redis.call('ZREMRANGEBYRANK', key, 0, -(keep + 1))
  end
  redis.call('EXPIRE', key, ARGV[3])
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""


def add_identity(counts: dict[_IdentityKey, int], key: _IdentityKey, count: int = 1) -> bool:
    """Add `count` to `key`; False (nothing added) when `key` is new and _MAX_PENDING_IDENTITIES are kept."""
    seen = counts.get(key)
    if seen is not None:
        counts[key] = seen + count
    elif len(counts) < _MAX_PENDING_IDENTITIES:
        counts[key] = count
    else:
        return False
    return True


class PendingCounts:
    """Counts not yet in Redis, for one key prefix."""

    __slots__ = ("blocked", "counts", "prefix", "shadow", "shadow_identities", "usage")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.counts: dict[_CountKey, int] = {}
        self.blocked: dict[_IdentityKey, int] = {}
        self.shadow: dict[_ShadowKey, int] = {}
        self.shadow_identities: dict[_IdentityKey, int] = {}
        self.usage: dict[_UsageKey, int] = {}

    def size(self) -> int:
        """Decisions counted in this batch."""
        return sum(self.counts.values())

    def empty(self) -> bool:
        """Nothing to write: no decision, no blocked identity, no shadow refusal, no usage."""
        return not (self.counts or self.blocked or self.shadow or self.shadow_identities or self.usage)

    def prune(self, oldest_hour: int) -> int:
        """Drop the hours before `oldest_hour` (Redis would have expired them already); returns the
        decisions dropped. Only for an open batch: a sealed one never changes."""
        dropped = 0
        for count_key in [key for key in self.counts if key[0] < oldest_hour]:
            dropped += self.counts.pop(count_key)
        for shadow_key in [key for key in self.shadow if key[0] < oldest_hour]:
            del self.shadow[shadow_key]
        for usage_key in [key for key in self.usage if key[0] < oldest_hour]:
            del self.usage[usage_key]
        return dropped


class SealedBatch(NamedTuple):
    """Counts sent (or about to be sent) under one number: applied once, however often they are sent."""

    counts: PendingCounts
    writer: str  # this process's id (made at start and in a forked child)
    number: int  # increasing per writer; sealed only once the batch before it was applied
    sealed_at: float  # time.time() when sealed: a batch is sent again for a bounded time only


def _hour_fields(batch: PendingCounts) -> dict[int, Counter[str]]:
    """hour -> field of the hour's hash -> what to add to it."""
    hours: defaultdict[int, Counter[str]] = defaultdict(Counter)
    for (hour, tier, policy, outcome, degraded), count in batch.counts.items():
        for name in decision_fields(tier, policy, outcome, degraded):
            hours[hour][name] += count
    for (hour, tier, policy), count in batch.shadow.items():
        hours[hour][shadow_field(tier, policy)] += count
    for (hour, tier, policy, unit), count in batch.usage.items():
        hours[hour][usage_field(tier, policy, unit)] += count
    return hours


def _day_members(counts: dict[_IdentityKey, int]) -> dict[int, Counter[str]]:
    """day -> identity label (made safe: never a key's secret) -> blocked decisions."""
    days: defaultdict[int, Counter[str]] = defaultdict(Counter)
    for (day, identity), count in counts.items():
        days[day][safe_identity(identity)] += count
    return days


def _script_input(batch: PendingCounts) -> tuple[list[str], list[Any]]:
    """The counter keys of `batch` and, per key, its kind, its number of pairs and the pairs."""
    keys: list[str] = []
    args: list[Any] = []
    targets = [(hour_key(batch.prefix, hour), "h", fields) for hour, fields in _hour_fields(batch).items()]
    targets += [(day_key(batch.prefix, day), "z", members) for day, members in _day_members(batch.blocked).items()]
    targets += [(shadow_day_key(batch.prefix, day), "z", members)
                for day, members in _day_members(batch.shadow_identities).items()]
    for key, kind, amounts in targets:
        keys.append(key)
        args += [kind, len(amounts)]
        for member, amount in amounts.items():
            args += [member, amount]
    return keys, args


def apply_batch(client: Any, batch: SealedBatch, *, ttl: int, keep: int) -> bool:
    """Add `batch` to Redis in one script call (one cluster slot: the {metrics} hash tag), each key with `ttl`
    seconds to live, each top set cut to its `keep` highest; True when applied now, False when this writer
    had applied this number already. Raises what the client raises."""
    # the writer's marker lives 2 x `ttl`: the recorder sends a batch again for at most `ttl`
    keys, args = _script_input(batch.counts)
    marker = applied_key(batch.counts.prefix, batch.writer)
    script = client.register_script(_APPLY_SCRIPT)
    return bool(script(keys=[marker, *keys], args=[batch.number, 2 * ttl, ttl, keep, *args]))
