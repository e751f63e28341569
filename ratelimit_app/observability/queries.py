"""The stored decision metrics, read back in one Redis round trip (`get_metrics`, `get_metrics_range`,
`recent_metrics`): every app server's counts, up to one flush interval behind."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from ..conf.settings import ratelimit_settings
from .schema import HOUR, day_key, hour_key, shadow_day_key

#: The widest range `get_metrics_range` reads at once.
MAX_RANGE_HOURS = 24 * 31


@dataclass(frozen=True)
class ShadowCount:
    """Requests a shadow limit (`policy`, of `tier`) would have refused: counted by this process, or
    stored for an hour or a range."""

    tier: str
    policy: str
    count: int


@dataclass(frozen=True)
class UsageCount:
    """Units of `unit` that requests used under usage limit `policy` of `tier` (what was settled, or the
    estimate where a request reported nothing): counted by this process, or stored for an hour or a range."""

    tier: str
    policy: str
    unit: str
    count: int


@dataclass(frozen=True)
class _Outcomes:
    allowed: int
    blocked: int

    @property
    def total(self) -> int:
        """Allowed plus blocked decisions."""
        return self.allowed + self.blocked

    @property
    def block_rate(self) -> float:
        """Blocked / total, from 0.0 to 1.0 (0.0 when there was no traffic)."""
        return self.blocked / self.total if self.total else 0.0


@dataclass(frozen=True)
class TierCounts(_Outcomes):
    """Decisions of one tier."""

    tier: str


@dataclass(frozen=True)
class PolicyCounts:
    """Requests blocked by one policy (the policy that denied, per decision)."""

    policy: str
    blocked: int


@dataclass(frozen=True)
class BlockedIdentity:
    """An identity label ("key:<prefix>", "ip:<address>", "user:<pk>") and its blocked requests."""

    identity: str
    blocked: int


#: The plain counters of an hour's hash, which a range sums.
_COUNTERS = ("allowed", "blocked", "degraded", "degraded_blocked", "unauthorized", "allowed_by_list", "denied_by_list")


@dataclass(frozen=True, kw_only=True)
class _Counts(_Outcomes):
    degraded: int
    degraded_blocked: int
    tiers: tuple[TierCounts, ...]  # most traffic first
    policies: tuple[PolicyCounts, ...]
    unauthorized: int = 0  # 401s: not in `total` (they were refused before any tier was known)
    allowed_by_list: int = 0  # allow rules: not in `total`
    denied_by_list: int = 0  # deny rules (403): not in `total`
    shadow: tuple[ShadowCount, ...] = ()  # would-be refusals of shadow limits, most first
    usage: tuple[UsageCount, ...] = ()  # units used under usage limits, most first


@dataclass(frozen=True, kw_only=True)
class HourMetrics(_Counts):
    """The stored counts of one UTC hour (`hour` is its start, timezone-aware)."""

    hour: datetime


@dataclass(frozen=True, kw_only=True)
class MetricsRange(_Counts):
    """The stored counts of consecutive UTC hours, from `start` to `end` (both hour starts, inclusive).

    `hours` has one entry per hour, oldest first (zeros where nothing was counted); `top_blocked` sums the
    UTC days the range touches, most blocked first, at most RATELIMIT['TOP_BLOCKED'] entries.
    """

    start: datetime
    end: datetime
    hours: tuple[HourMetrics, ...]
    top_blocked: tuple[BlockedIdentity, ...]
    top_shadow_blocked: tuple[BlockedIdentity, ...] = ()  # identities shadow limits would have blocked


def _hour_index(moment: datetime, name: str) -> int:
    if not isinstance(moment, datetime):
        raise TypeError(f"{name}: expected a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name}: {moment!r} is naive; pass a timezone-aware datetime (metrics use UTC hours)")
    return int(moment.timestamp()) // HOUR


def _hour_start(index: int) -> datetime:
    return datetime.fromtimestamp(index * HOUR, tz=timezone.utc)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _parse_hour(index: int, raw: dict[Any, Any]) -> HourMetrics:
    fields = {_text(name): int(value) for name, value in raw.items()}
    tiers: dict[str, dict[str, int]] = {}
    policies: dict[str, int] = {}
    shadow: dict[tuple[str, str], int] = {}
    usage: dict[tuple[str, str, str], int] = {}
    for name, value in fields.items():
        kind, _, rest = name.partition(":")
        if kind == "usage":
            tier, policy, unit = [*rest.split(":"), "", ""][:3]
            usage[(tier, policy, unit)] = value
        elif kind == "shadow":
            tier, _, policy = rest.partition(":")
            shadow[(tier, policy)] = value
        elif kind == "tier":
            tier, _, outcome = rest.rpartition(":")
            tiers.setdefault(tier, {})[outcome] = value
        elif kind == "policy":
            policy, _, _ = rest.rpartition(":")
            policies[policy] = value
    counters: dict[str, Any] = {name: fields.get(name, 0) for name in _COUNTERS}
    return HourMetrics(
        hour=_hour_start(index), policies=_sorted_policies(policies), shadow=_sorted_shadow(shadow),
        usage=_sorted_usage(usage),
        tiers=_sorted_tiers({tier: (c.get("allowed", 0), c.get("blocked", 0)) for tier, c in tiers.items()}),
        **counters,
    )


def _sorted_shadow(counts: dict[tuple[str, str], int]) -> tuple[ShadowCount, ...]:
    return tuple(ShadowCount(tier, policy, n)
                 for (tier, policy), n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _sorted_usage(counts: dict[tuple[str, str, str], int]) -> tuple[UsageCount, ...]:
    return tuple(UsageCount(tier, policy, unit, n)
                 for (tier, policy, unit), n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _sorted_tiers(counts: dict[str, tuple[int, int]]) -> tuple[TierCounts, ...]:
    items = [TierCounts(allowed=a, blocked=b, tier=tier) for tier, (a, b) in counts.items()]
    return tuple(sorted(items, key=lambda t: (-t.total, t.tier)))


def _sorted_policies(counts: dict[str, int]) -> tuple[PolicyCounts, ...]:
    return tuple(PolicyCounts(p, n) for p, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def get_metrics(hour: datetime | None = None) -> HourMetrics:
    """The stored counts of the UTC hour containing `hour` (timezone-aware; default: now).

    Reads Redis (one round trip); counts still in some process's memory are not included (see flush).
    """
    index = int(time.time()) // HOUR if hour is None else _hour_index(hour, "hour")
    return _read_range(index, index).hours[0]


def get_metrics_range(start: datetime, end: datetime) -> MetricsRange:
    """The stored counts of every UTC hour from the one containing `start` to the one containing `end`.

    Both are timezone-aware datetimes; at most MAX_RANGE_HOURS hours. One Redis round trip.
    """
    first, last = _hour_index(start, "start"), _hour_index(end, "end")
    if last < first:
        raise ValueError(f"end: {end.isoformat()} is before start {start.isoformat()}")
    if last - first + 1 > MAX_RANGE_HOURS:
        raise ValueError(f"range: {last - first + 1} hours requested; at most {MAX_RANGE_HOURS} are read at once")
    return _read_range(first, last)


def recent_metrics(hours: int = 48) -> MetricsRange:
    """The last `hours` UTC hours, the current one included (what the dashboard shows)."""
    if isinstance(hours, bool) or not isinstance(hours, int) or not 1 <= hours <= MAX_RANGE_HOURS:
        raise ValueError(f"hours: {hours!r} must be an integer from 1 to {MAX_RANGE_HOURS}")
    now = datetime.now(timezone.utc)
    return get_metrics_range(now - timedelta(hours=hours - 1), now)


def _top(replies_of_days: list[Any], top: int) -> tuple[BlockedIdentity, ...]:
    """The `top` highest identities of the days' sorted sets, summed over the days, most first."""
    identities: dict[str, int] = {}
    for members in replies_of_days:
        for member, score in members or ():
            label = _text(member)
            identities[label] = identities.get(label, 0) + int(score)
    ranked = sorted(identities.items(), key=lambda item: (-item[1], item[0]))[:top]
    return tuple(BlockedIdentity(identity, count) for identity, count in ranked)


def _range_of(first: int, last: int, hours: tuple[HourMetrics, ...], top_blocked: tuple[BlockedIdentity, ...],
              top_shadow: tuple[BlockedIdentity, ...]) -> MetricsRange:
    """The range's sums of `hours`, with its top identities."""
    tiers: dict[str, tuple[int, int]] = {}
    policies: dict[str, int] = {}
    shadow: dict[tuple[str, str], int] = {}
    usage: dict[tuple[str, str, str], int] = {}
    for hour in hours:
        for t in hour.tiers:
            allowed, blocked = tiers.get(t.tier, (0, 0))
            tiers[t.tier] = (allowed + t.allowed, blocked + t.blocked)
        for p in hour.policies:
            policies[p.policy] = policies.get(p.policy, 0) + p.blocked
        for item in hour.shadow:
            shadow[(item.tier, item.policy)] = shadow.get((item.tier, item.policy), 0) + item.count
        for used in hour.usage:
            usage_key = (used.tier, used.policy, used.unit)
            usage[usage_key] = usage.get(usage_key, 0) + used.count
    sums: dict[str, Any] = {name: sum(getattr(hour, name) for hour in hours) for name in _COUNTERS}
    return MetricsRange(
        start=_hour_start(first), end=_hour_start(last), hours=hours, tiers=_sorted_tiers(tiers),
        policies=_sorted_policies(policies), shadow=_sorted_shadow(shadow), usage=_sorted_usage(usage),
        top_blocked=top_blocked,
        top_shadow_blocked=top_shadow, **sums,
    )


def _read_range(first: int, last: int) -> MetricsRange:
    from ..service.connection import get_redis

    prefix = ratelimit_settings.KEY_PREFIX
    top = int(ratelimit_settings.TOP_BLOCKED)
    days = list(range(first // 24, last // 24 + 1))
    pipe = get_redis().pipeline(transaction=False)
    for index in range(first, last + 1):
        pipe.hgetall(hour_key(prefix, index))
    for day in days:
        pipe.zrevrange(day_key(prefix, day), 0, top - 1, withscores=True)
    for day in days:
        pipe.zrevrange(shadow_day_key(prefix, day), 0, top - 1, withscores=True)
    replies = pipe.execute()
    count = last - first + 1
    hours = tuple(_parse_hour(index, raw or {})
                  for index, raw in zip(range(first, last + 1), replies[:count], strict=True))
    return _range_of(first, last, hours, _top(replies[count:count + len(days)], top),
                     _top(replies[count + len(days):], top))

