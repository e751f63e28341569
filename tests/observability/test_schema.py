"""ratelimit_app.observability.schema: the metrics keys (UTC hours and days, one hash tag) and the fields one
decision adds to, read back by the queries as the counts that were written."""

from __future__ import annotations

import calendar
from datetime import datetime, timezone

import pytest
import redis
from redis.crc import key_slot

from ratelimit_app.observability.queries import get_metrics
from ratelimit_app.observability.schema import (
    HOUR,
    day_key,
    decision_fields,
    hour_key,
    shadow_day_key,
    shadow_field,
    top_candidates,
)


def test_keys_name_their_utc_hour_and_day() -> None:
    moment = calendar.timegm((2026, 3, 9, 23, 59, 59))
    hour, day = moment // HOUR, moment // 86400
    assert hour_key("rl", hour) == "rl:{metrics}:h:2026030923"
    assert hour_key("rl", hour + 1) == "rl:{metrics}:h:2026031000"  # the next hour is the next day's first
    assert day_key("rl", day) == "rl:{metrics}:blocked:20260309"
    assert shadow_day_key("rl", day) == "rl:{metrics}:shadow:20260309"
    assert hour_key("rl", 0) == "rl:{metrics}:h:1970010100"


def test_every_key_of_a_prefix_lands_in_one_cluster_slot() -> None:
    keys = [hour_key("app:rl", 500_000), hour_key("app:rl", 500_001), day_key("app:rl", 20_000),
            shadow_day_key("app:rl", 20_001)]
    assert len({key_slot(key.encode()) for key in keys}) == 1


@pytest.mark.parametrize(("outcome", "degraded", "fields"), [
    ("allowed", False, ["allowed", "tier:free:allowed"]),
    ("blocked", False, ["blocked", "tier:free:blocked", "policy:burst:blocked"]),
    ("allowed", True, ["allowed", "tier:free:allowed", "degraded"]),
    ("blocked", True, ["blocked", "tier:free:blocked", "policy:burst:blocked", "degraded", "degraded_blocked"]),
    ("unauthorized", False, ["unauthorized", "tier:free:unauthorized"]),
    ("denied_by_list", False, ["denied_by_list", "tier:free:denied_by_list"]),
])
def test_the_fields_one_decision_adds_to(outcome: str, degraded: bool, fields: list[str]) -> None:
    assert decision_fields("free", "burst", outcome, degraded) == fields


def test_a_day_keeps_enough_candidates_for_its_top_to_be_exact() -> None:
    assert top_candidates(1) == 1000 and top_candidates(20) == 1000
    assert top_candidates(21) == 1050 and top_candidates(100) == 5000


def test_what_the_fields_count_is_what_the_queries_read_back(redis_client: redis.Redis, key_prefix: str) -> None:
    hour = datetime(2026, 3, 9, 14, 30, tzinfo=timezone.utc)
    key = hour_key(key_prefix, int(hour.timestamp()) // HOUR)
    decisions = [("free", "", "allowed", False)] * 3 + [("free", "burst", "blocked", False)] * 2 + \
        [("pro", "day", "blocked", True), ("pro", "", "allowed", True), ("free", "", "unauthorized", False)]
    for tier, policy, outcome, degraded in decisions:
        for name in decision_fields(tier, policy, outcome, degraded):
            redis_client.hincrby(key, name, 1)
    redis_client.hincrby(key, shadow_field("pro", "minute"), 4)
    read = get_metrics(hour)
    assert (read.allowed, read.blocked, read.unauthorized) == (4, 3, 1)
    assert (read.degraded, read.degraded_blocked) == (2, 1)
    assert [(t.tier, t.allowed, t.blocked) for t in read.tiers] == [("free", 3, 2), ("pro", 1, 1)]
    assert [(p.policy, p.blocked) for p in read.policies] == [("burst", 2), ("day", 1)]
    assert [(s.tier, s.policy, s.count) for s in read.shadow] == [("pro", "minute", 4)]
