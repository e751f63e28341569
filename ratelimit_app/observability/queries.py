"""The stored decision metrics, read back in one Redis round trip (`get_metrics`, `get_metrics_range`,
`recent_metrics`): every app server's counts, up to one flush interval behind."""

from __future__ import annotations

import time
from collections import Counter
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
    """The stored counts of consecutive UTC hours, from `start` to `end` (both hour starts, inclusive)."""

    start: datetime
    end: datetime
    hours: tuple[HourMetrics, ...]  # one per hour, oldest first (zeros where nothing was counted)
    #: the UTC days the range touches, summed: most blocked first, at most RATELIMIT['TOP_BLOCKED']
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


def _ranked(counts: Counter[Any]) -> list[tuple[Any, int]]:
    """The items of `counts`, most first (ties in key order)."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _counts(fields: Counter[str]) -> dict[str, Any]:
    """The `_Counts` fields of an hour's hash, or of the hashes of a range summed field by field."""
    tiers: dict[str, Counter[str]] = {}
    policies: Counter[str] = Counter()
    shadow: Counter[tuple[str, str]] = Counter()
    usage: Counter[tuple[str, str, str]] = Counter()
    for name, value in fields.items():
        kind, _, rest = name.partition(":")
        if kind == "usage":
            tier, policy, unit = [*rest.split(":"), "", ""][:3]
            usage[(tier, policy, unit)] += value
        elif kind == "shadow":
            tier, _, policy = rest.partition(":")
            shadow[(tier, policy)] += value
        elif kind == "tier":
            tier, _, outcome = rest.rpartition(":")
            tiers.setdefault(tier, Counter())[outcome] += value
        elif kind == "policy":
            policies[rest.rpartition(":")[0]] += value
    ranked_tiers = sorted((TierCounts(allowed=c["allowed"], blocked=c["blocked"], tier=tier)
                           for tier, c in tiers.items()), key=lambda t: (-t.total, t.tier))
    return {
        **{name: fields[name] for name in _COUNTERS},
        "tiers": tuple(ranked_tiers),
        "policies": tuple(PolicyCounts(policy, n) for policy, n in _ranked(policies)),
        "shadow": tuple(ShadowCount(tier, policy, n) for (tier, policy), n in _ranked(shadow)),
        "usage": tuple(UsageCount(tier, policy, unit, n) for (tier, policy, unit), n in _ranked(usage)),
    }


def get_metrics(hour: datetime | None = None) -> HourMetrics:
    """The stored counts of the UTC hour containing `hour` (timezone-aware; default: now), in one Redis round
    trip; counts still in some process's memory are not included (see flush)."""
    index = int(time.time()) // HOUR if hour is None else _hour_index(hour, "hour")
    return _read_range(index, index).hours[0]


def get_metrics_range(start: datetime, end: datetime) -> MetricsRange:
    """The stored counts of every UTC hour from the one containing `start` to the one containing `end`
    (timezone-aware; at most MAX_RANGE_HOURS hours), in one Redis round trip."""
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
    identities: Counter[str] = Counter()
    for members in replies_of_days:
        for member, score in members or ():
            identities[_text(member)] += int(score)
    return tuple(BlockedIdentity(identity, count) for identity, count in _ranked(identities)[:top])


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
    hour_fields = [Counter({_text(name): int(value) for name, value in (raw or {}).items()})
                   for raw in replies[:count]]
    hours = tuple(HourMetrics(hour=_hour_start(index), **_counts(fields))
                  for index, fields in zip(range(first, last + 1), hour_fields, strict=True))
    summed: Counter[str] = Counter()
    for fields in hour_fields:
        summed.update(fields)  # (not `+`, which drops a field counted 0, such as a request that used no units)
    return MetricsRange(start=_hour_start(first), end=_hour_start(last), hours=hours,
                        top_blocked=_top(replies[count:count + len(days)], top),
                        top_shadow_blocked=_top(replies[count + len(days):], top), **_counts(summed))
