"""ratelimit_app.observability.queries: what `get_metrics`, `get_metrics_range` and `recent_metrics` read back
from Redis (hours in UTC whatever the datetime's zone, sums and orderings, the top identities of the days
a range touches, what is not part of `total`), and their limits."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Any

import pytest
import redis

from ratelimit_app.observability.queries import (
    MAX_RANGE_HOURS,
    get_metrics,
    get_metrics_range,
    recent_metrics,
)
from ratelimit_app.observability.schema import HOUR, day_key, hour_key, shadow_day_key

UTC = timezone.utc
START = datetime(2026, 3, 9, 22, 0, tzinfo=UTC)  # 22:00 and 23:00 on the 9th, 00:00 on the 10th


def index(moment: datetime) -> int:
    return int(moment.timestamp()) // HOUR


@pytest.fixture
def stored(redis_client: redis.Redis, key_prefix: str) -> None:
    """Three hours across midnight UTC, with blocked and would-be-blocked identities on both days."""
    first = index(START)
    redis_client.hset(hour_key(key_prefix, first), mapping={
        "allowed": 6, "blocked": 2, "tier:free:allowed": 4, "tier:free:blocked": 2, "tier:pro:allowed": 2,
        "policy:burst:blocked": 2, "unauthorized": 3, "tier:ip:unauthorized": 3, "denied_by_list": 1,
        "degraded": 1, "degraded_blocked": 1, "shadow:pro:dry": 5})
    redis_client.hset(hour_key(key_prefix, first + 2), mapping={
        "allowed": 1, "blocked": 3, "tier:pro:allowed": 1, "tier:pro:blocked": 3, "policy:minute:blocked": 3,
        "allowed_by_list": 4, "shadow:pro:dry": 1, "shadow:free:other": 2})
    day = first // 24
    redis_client.zadd(day_key(key_prefix, day), {"ip:192.0.2.1": 2, "key:aaaa1111": 1})
    redis_client.zadd(day_key(key_prefix, day + 1), {"key:aaaa1111": 3, "user:7": 2})
    redis_client.zadd(shadow_day_key(key_prefix, day + 1), {"ip:192.0.2.9": 6})


def test_a_range_reads_every_hour_and_sums_it(stored: None) -> None:
    metrics = get_metrics_range(START, START + timedelta(hours=2, minutes=59))
    assert (metrics.start, metrics.end) == (START, START + timedelta(hours=2))
    assert [h.hour for h in metrics.hours] == [START + timedelta(hours=n) for n in range(3)]
    assert [h.total for h in metrics.hours] == [8, 0, 4]  # the empty hour is there, with zeros
    assert (metrics.allowed, metrics.blocked, metrics.total) == (7, 5, 12)
    assert metrics.block_rate == pytest.approx(5 / 12)
    # refusals before any tier was known and allow/deny rules are counted apart from the total
    assert (metrics.unauthorized, metrics.allowed_by_list, metrics.denied_by_list) == (3, 4, 1)
    assert (metrics.degraded, metrics.degraded_blocked) == (1, 1)
    # most traffic first; a tier that only had 401s is listed, with none allowed or blocked
    assert [(t.tier, t.allowed, t.blocked) for t in metrics.tiers] == [("free", 4, 2), ("pro", 3, 3), ("ip", 0, 0)]
    assert [(p.policy, p.blocked) for p in metrics.policies] == [("minute", 3), ("burst", 2)]
    assert [(s.tier, s.policy, s.count) for s in metrics.shadow] == [("pro", "dry", 6), ("free", "other", 2)]


def test_the_top_identities_sum_the_days_the_range_touches(stored: None, settings: Any) -> None:
    both_days = get_metrics_range(START, START + timedelta(hours=2))
    assert [(b.identity, b.blocked) for b in both_days.top_blocked] == \
        [("key:aaaa1111", 4), ("ip:192.0.2.1", 2), ("user:7", 2)]  # ties: by label
    assert [(b.identity, b.blocked) for b in both_days.top_shadow_blocked] == [("ip:192.0.2.9", 6)]
    first_day = get_metrics_range(START, START + timedelta(hours=1))
    assert [(b.identity, b.blocked) for b in first_day.top_blocked] == [("ip:192.0.2.1", 2), ("key:aaaa1111", 1)]
    settings.RATELIMIT = {**settings.RATELIMIT, "TOP_BLOCKED": 1}
    assert [b.identity for b in get_metrics_range(START, START + timedelta(hours=2)).top_blocked] == ["key:aaaa1111"]


def test_an_hour_is_the_utc_hour_containing_the_moment_whatever_its_zone(stored: None) -> None:
    paris = timezone(timedelta(hours=1))
    hour = get_metrics(datetime(2026, 3, 9, 23, 59, tzinfo=paris))  # 22:59 UTC
    assert hour.hour == START and hour.hour.tzinfo == UTC and hour.total == 8
    empty = get_metrics(START + timedelta(hours=1))
    assert (empty.total, empty.block_rate, empty.tiers, empty.policies) == (0, 0.0, (), ())


def test_the_current_hour_by_default_and_recent_hours_end_with_it(redis_client: redis.Redis,
                                                                    key_prefix: str) -> None:
    now = index(datetime.now(UTC))
    for hour in (now - 1, now, now + 1):  # the same whichever of two hours the calls below fall in
        redis_client.hset(hour_key(key_prefix, hour), mapping={"allowed": 2})
    redis_client.hset(hour_key(key_prefix, now + 3), mapping={"allowed": 100})  # never the current hour
    assert get_metrics().allowed == 2
    assert recent_metrics(1).allowed == 2 and recent_metrics(2).allowed == 4
    assert len(recent_metrics(5).hours) == 5 and recent_metrics(5).allowed in (4, 6)


def test_ranges_are_bounded_and_moments_must_be_aware_datetimes() -> None:
    assert len(get_metrics_range(START, START + timedelta(hours=MAX_RANGE_HOURS - 1)).hours) == MAX_RANGE_HOURS
    with pytest.raises(ValueError, match=f"{MAX_RANGE_HOURS + 1} hours requested"):
        get_metrics_range(START, START + timedelta(hours=MAX_RANGE_HOURS))
    with pytest.raises(TypeError, match="start: expected a datetime, got date"):
        get_metrics_range(date(2026, 3, 9), START)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="end: .* is naive"):
        get_metrics_range(START, datetime(2026, 3, 10))
    for hours in (0, MAX_RANGE_HOURS + 1, True, 2.0):
        with pytest.raises(ValueError, match="hours: .* must be an integer from 1 to 744"):
            recent_metrics(hours)  # type: ignore[arg-type]
    assert len(recent_metrics(MAX_RANGE_HOURS).hours) == MAX_RANGE_HOURS
