"""Calendar quotas (per day, week or month in the tier's time zone): boundaries from Redis time, DST days
of 23 and 25 hours, a monthly quota crossing a month boundary (with the tests-only clock shift instead
of waiting), the admin, headers, the 429 body and the status endpoint."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from django.test import Client
from django.urls import reverse

from ratelimit_app import Policy, RateLimiter
from ratelimit_app.core.calendars import CALENDAR_PERIODS, period_bounds
from ratelimit_app.core.keys import state_entries
from ratelimit_app.models import Tier, TierLimit
from tests.support.limits_support import make_key, make_tier, parse_ietf
from tests.test_admin import form_data


def redis_now(client: Any) -> float:
    seconds, microseconds = client.time()
    return seconds + microseconds / 1e6


def shifted(unit: str, time_zone: str, shift_s: float, limit: int = 3) -> Policy:
    return Policy("quota", "fixed_window", limit=limit, period=CALENDAR_PERIODS[unit], calendar=unit,
                  time_zone=time_zone, clock_shift_ms=math.ceil(shift_s * 1000))  # never before the moment


def at(limiter: RateLimiter, unit: str, time_zone: str, moment: datetime, limit: int = 3) -> Policy:
    """A calendar policy decided as if Redis time were `moment` (the shift is measured now, so the
    decision runs a few milliseconds after `moment`)."""
    return shifted(unit, time_zone, moment.timestamp() - redis_now(limiter.client), limit)


def test_a_monthly_quota_crossing_the_month_boundary(limiter: RateLimiter) -> None:
    zone = "Europe/Paris"
    _, month_end = period_bounds("month", zone, redis_now(limiter.client))
    before = at(limiter, "month", zone, month_end.fromtimestamp(month_end.timestamp() - 5, ZoneInfo(zone)))
    assert [limiter.hit("acme", [before]).allowed for _ in range(4)] == [True, True, True, False]
    refused = limiter.hit("acme", [before])
    assert refused.policy == "quota" and refused.retry_after is not None
    assert 3.0 < refused.retry_after <= 5.0  # until 00:00 on the 1st
    assert 3.0 < refused.reset_after <= 5.0
    after = at(limiter, "month", zone, month_end.fromtimestamp(month_end.timestamp() + 5, ZoneInfo(zone)))
    fresh = limiter.hit("acme", [after])  # the same key, the next month: a fresh quota
    assert fresh.allowed and fresh.remaining == 2
    assert limiter.keys("acme", [before]) == limiter.keys("acme", [after])
    _, next_end = period_bounds("month", zone, month_end.timestamp() + 5)
    assert abs(fresh.reset_after - (next_end.timestamp() - month_end.timestamp() - 5)) < 1.0


@pytest.mark.parametrize(("day", "hours"), [("2027-03-14", 23), ("2027-11-07", 25), ("2027-06-01", 24)])
def test_days_with_a_dst_change_last_23_or_25_hours(limiter: RateLimiter, day: str, hours: int) -> None:
    zone = ZoneInfo("America/New_York")
    start = datetime.fromisoformat(f"{day}T00:00:00").replace(tzinfo=zone)
    policy = at(limiter, "day", "America/New_York", start.fromtimestamp(start.timestamp() + 1800, zone))
    decision = limiter.hit(f"dst-{day}", [policy])
    assert abs(decision.reset_after - (hours * 3600 - 1800)) < 1.0


def test_a_weekly_quota_starts_on_monday(limiter: RateLimiter) -> None:
    zone = ZoneInfo("Asia/Kolkata")
    sunday_evening = datetime(2027, 1, 10, 23, 59, 0, tzinfo=zone)  # a Sunday
    assert sunday_evening.weekday() == 6
    policy = at(limiter, "week", "Asia/Kolkata", sunday_evening, limit=1)
    assert limiter.hit("weekly", [policy]).allowed
    refused = limiter.hit("weekly", [policy])
    assert not refused.allowed and refused.retry_after is not None and 55.0 < refused.retry_after <= 60.0
    monday = at(limiter, "week", "Asia/Kolkata", datetime(2027, 1, 11, 0, 0, 30, tzinfo=zone), limit=1)
    assert limiter.hit("weekly", [monday]).allowed


def test_calendar_policies_are_validated() -> None:
    with pytest.raises(ValueError, match="fixed_window"):
        Policy("q", "sliding_window", limit=1, period=86400, calendar="day")
    with pytest.raises(ValueError, match="time_zone"):
        Policy("q", "fixed_window", limit=1, period=86400, calendar="day", time_zone="Mars/Olympus")
    with pytest.raises(ValueError, match="calendar"):
        Policy("q", "fixed_window", limit=1, period=86400, calendar="year")


@pytest.mark.django_db
def test_staff_set_a_monthly_quota_in_the_admin(admin_client: Client, client: Client, settings: Any,
                                                redis_client: redis.Redis) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": None}
    tier = make_tier("metered", [])
    url = reverse("admin:ratelimit_app_tier_change", args=[tier.pk])
    page = admin_client.get(url)
    data = form_data(page)
    data.update({"time_zone": "America/New_York", "limits-TOTAL_FORMS": "1", "limits-INITIAL_FORMS": "0",
                 "limits-0-name": "month", "limits-0-algorithm": "fixed_window", "limits-0-limit": "3",
                 "limits-0-period": "1", "limits-0-calendar": "month", "limits-0-enabled": "on"})
    saved = admin_client.post(url, data)
    assert saved.status_code == 302, saved.context and saved.context["adminform"].form.errors
    quota = TierLimit.objects.get(tier=tier)
    assert quota.period == CALENDAR_PERIODS["month"] and str(quota) == "month: 3 per calendar month"

    key = make_key("metered")
    responses = [client.get("/api/users", HTTP_X_API_KEY=key) for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    _, month_end = period_bounds("month", "America/New_York", redis_now(redis_client))
    until_reset = month_end.timestamp() - redis_now(redis_client)
    assert abs(int(responses[0]["X-RateLimit-Reset"]) - until_reset) <= 2
    assert parse_ietf(responses[0]["RateLimit-Policy"])["month"] == {"q": 3, "w": 31 * 86400}
    assert abs(parse_ietf(responses[2]["RateLimit"])["month"]["t"] - until_reset) <= 2
    body = responses[3].json()
    assert body["policy"] == "month" and abs(body["retry_after"] - until_reset) <= 2
    status = client.get("/api/rate-limit/status", HTTP_X_API_KEY=key).json()
    assert [(q["name"], q["calendar"], q["used"], q["remaining"]) for q in status["limits"]] == [
        ("month", "month", 3, 0)]


@pytest.mark.django_db
def test_the_admin_refuses_a_calendar_quota_on_another_algorithm_and_an_unknown_zone(admin_client: Client) -> None:
    tier = make_tier("metered", [])
    url = reverse("admin:ratelimit_app_tier_change", args=[tier.pk])
    data = form_data(admin_client.get(url))
    data.update({"time_zone": "Europe/Atlantis", "limits-TOTAL_FORMS": "1", "limits-INITIAL_FORMS": "0",
                 "limits-0-name": "month", "limits-0-algorithm": "sliding_window", "limits-0-limit": "3",
                 "limits-0-period": "60", "limits-0-calendar": "month", "limits-0-enabled": "on"})
    refused = admin_client.post(url, data)
    assert refused.status_code == 200
    assert "time zone" in str(refused.context["adminform"].form.errors["time_zone"])
    assert "fixed window" in str(refused.context["inline_admin_formsets"][0].formset.errors)
    assert Tier.objects.get(pk=tier.pk).time_zone == "UTC"


@pytest.mark.django_db
def test_ratelimit_status_shows_the_current_period(client: Client, settings: Any) -> None:
    from io import StringIO

    from django.core.management import call_command

    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": None}
    tier = make_tier("metered", [])
    tier.time_zone = "Europe/Paris"
    tier.save()
    quota = TierLimit(tier=tier, name="month", algorithm="fixed_window", limit=1000, period=1, calendar="month")
    quota.full_clean()
    quota.save()
    key = make_key("metered")
    assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200
    out = StringIO()
    call_command("ratelimit_status", key.partition(".")[0], stdout=out)
    row = next(line for line in out.getvalue().splitlines() if " month " in line).split()
    assert row[1:5] == ["month", "fixed_window", "1000/calendar-month@Europe/Paris", "999/1000"]


def test_a_calendar_quota_has_a_tag_letter_of_its_own_and_an_integer_state(limiter: RateLimiter) -> None:
    quota = Policy("quota", "fixed_window", limit=5, period=CALENDAR_PERIODS["day"], calendar="day",
                   time_zone="UTC")
    plain = Policy("quota", "fixed_window", limit=5, period=CALENDAR_PERIODS["day"])
    # both live in the identity's key, each in an entry of its own (the tag: the letter, then the name)
    [key], [same] = limiter.keys("acme", [quota]), limiter.keys("acme", [plain])
    assert key == same
    assert limiter.hit("acme", [quota], cost=2).remaining == 3
    stored = limiter.client.get(key)
    assert isinstance(stored, bytes) and set(state_entries(stored)) == {"kquota"}
    assert int.from_bytes(state_entries(stored)["kquota"][1], "big") // 65536 == 2  # 65536 x used + period mod 65536
    assert limiter.peek("acme", [plain]).remaining == 5  # the plain window's state is apart
