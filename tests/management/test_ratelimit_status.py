"""ratelimit_app.management.commands.ratelimit_status: how a limit and a duration read in its table
(`describe`, `seconds`), the allow or deny rule naming a target (`listing`), and what the command shows
for a tier's fail mode, shadow limits and a tier without limits, against the real Redis and database."""

from __future__ import annotations

import io
import math
import re

import pytest
from django.core.management import call_command

from ratelimit_app import Policy, RateLimiter
from ratelimit_app.management.commands.ratelimit_status import (
    _ALLOW_LISTED,
    _DENY_LISTED,
    _describe,
    _listing,
    _seconds,
)
from ratelimit_app.models import ApiKey, ClientRule, TierLimit
from ratelimit_app.service.limiter import get_limiter
from tests.support.limits_support import make_key, make_tier


def status(target: str) -> str:
    out = io.StringIO()
    call_command("ratelimit_status", target, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize(("value", "shown"), [
    (None, "-"), (math.inf, "never"), (0.0, "0.0s"), (12.34, "12.3s"), (59.94, "59.9s"), (60.0, "1m 00s"),
    (245.9, "4m 05s"), (3599.0, "59m 59s"), (3600.0, "1h 00m"), (38_160.0, "10h 36m"), (90_061.0, "25h 01m"),
])
def test_seconds_reads_as_a_person_would_say_it(value: float | None, shown: str) -> None:
    assert _seconds(value) == shown


def test_describe_shows_the_rate_its_burst_a_calendar_and_shadow() -> None:
    assert _describe(Policy("minute", "sliding_window", limit=20, period=60)) == "20/m"
    assert _describe(Policy("burst", "token_bucket", limit=20, period=60, burst=10)) == "20/m burst 10"
    assert _describe(Policy("slow", "gcra", limit=5, period=600, shadow=True)) == "5/10m shadow"
    month = Policy("month", "fixed_window", limit=1000, period=2678400, calendar="month", time_zone="Europe/Paris",
                   shadow=True)
    assert _describe(month) == "1000/calendar-month@Europe/Paris shadow"
    assert _describe(Policy("tokens", "sliding_window", limit=40_000, period=60, unit="tokens")) == "40000/m tokens"


@pytest.mark.django_db
def test_listing_names_the_rule_of_a_key_or_of_an_addresss_network() -> None:
    key = make_key(make_tier("listed", [("minute", "fixed_window", 5, 60, None, "")]))
    api_key = ApiKey.objects.get(prefix=key.partition(".")[0])
    assert _listing(f"key:{api_key.prefix}") is None and _listing("ip:192.0.2.7") is None
    ClientRule.objects.create(action="allow", api_key=api_key)
    ClientRule.objects.create(action="deny", network="192.0.2.0/24")
    assert _listing(f"key:{api_key.prefix}") == _ALLOW_LISTED
    assert _listing("ip:192.0.2.7") == _DENY_LISTED and _listing("ip:198.51.100.1") is None
    assert _listing("ip:192.0.2.0/24") is None  # a network target: no one address to look up
    assert _listing("user:5") is None
    assert f"Rule:      {_ALLOW_LISTED}" in status(api_key.prefix)


@pytest.mark.django_db
def test_a_tiers_own_fail_mode_a_shadow_limit_that_would_deny_and_a_tier_without_limits() -> None:
    tier = make_tier("shown", [("minute", "fixed_window", 5, 60, None, "")], fail_mode="closed")
    TierLimit.objects.create(tier=tier, name="dry", algorithm="fixed_window", limit=1, period=60, shadow=True)
    key = make_key(tier)
    prefix = key.partition(".")[0]
    policies = (Policy("minute", "fixed_window", limit=5, period=60),
                Policy("dry", "fixed_window", limit=1, period=60, shadow=True))
    for _ in range(2):
        get_limiter().hit(f"key:{prefix}", policies)
    out = status(prefix)
    assert "Tier:      shown (Shown), fail mode closed" in out
    [dry] = [line for line in out.splitlines() if re.match(rf"key:{prefix}\s+dry\s", line)]
    assert "1/m shadow" in dry and "0/1" in dry and "would deny (shadow), retry in " in dry
    [minute] = [line for line in out.splitlines() if re.match(rf"key:{prefix}\s+minute\s", line)]
    assert minute.rstrip().endswith("allowed") and "3/5" in minute
    bare = make_key(make_tier("bare", []))
    out = status(bare.partition(".")[0])
    assert "fail mode default (open)" in out
    assert f"key:{bare.partition('.')[0]}: tier bare has no enabled limits (unlimited)" in out


@pytest.mark.django_db
def test_a_usage_limit_is_listed_with_its_unit_and_what_remains() -> None:
    tier = make_tier("metered", [("minute", "fixed_window", 5, 60, None, "")])
    TierLimit.objects.create(tier=tier, name="tokens", algorithm="sliding_window", limit=2000, period=60,
                             scope="llm", unit="tokens")
    key = make_key(tier)
    prefix = key.partition(".")[0]
    tokens = Policy("llm.tokens", "sliding_window", limit=2000, period=60, unit="tokens")
    engine = get_limiter().limiter()
    assert isinstance(engine, RateLimiter)
    _, reservation = engine.reserve(f"key:{prefix}", [tokens], {"tokens": 500})
    assert _describe(tokens) == "2000/m tokens"
    [row] = [line for line in status(prefix).splitlines() if re.match(rf"key:{prefix}\s+llm.tokens\s", line)]
    assert "2000/m tokens" in row and "1500/2000" in row
    get_limiter().settle(reservation, {"tokens": 120})
    [row] = [line for line in status(prefix).splitlines() if re.match(rf"key:{prefix}\s+llm.tokens\s", line)]
    assert "1880/2000" in row
