"""ratelimit_app.management.commands.ratelimit_metrics: its table helpers (`table`, `section`, `rate`), the
report's sections for what was stored (shadow limits, allow/deny rules, nothing at all), the bound on
--hours from METRICS_TTL_HOURS, and a clear error when Redis does not answer."""

from __future__ import annotations

import io
import re
from datetime import datetime, timezone
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError, OutputWrapper

from devtools.embedded import free_port
from ratelimit_app.management.commands.ratelimit_metrics import _rate, _section, _table
from ratelimit_app.observability.schema import HOUR, day_key, hour_key, shadow_day_key


def metrics(*args: str) -> str:
    out = io.StringIO()
    call_command("ratelimit_metrics", *args, stdout=out)
    return out.getvalue()


def test_table_aligns_text_left_and_numbers_right() -> None:
    rows: list[tuple[str, ...]] = [("tier", "allowed", "blocked"),
                                   ("enterprise", "1,234", "5"), ("free", "7", "12,345")]
    assert _table(rows) == ["tier        allowed  blocked",
                           "enterprise    1,234        5",
                           "free              7   12,345"]
    assert _table([("a", "b", "c"), ("long", "x", "1")], numeric_from=2) == ["a     b  c", "long  x  1"]


def test_section_writes_its_rows_or_only_its_empty_title() -> None:
    text = io.StringIO()
    out = OutputWrapper(text)  # a command's stdout
    _section(out, "Per tier:", "Per tier: no traffic", ("tier", "n"), [("free", "3")])
    _section(out, "Per policy:", "Per policy: nothing blocked", ("policy", "n"), [])
    assert text.getvalue().splitlines() == ["Per tier:", "  tier  n", "  free  3", "Per policy: nothing blocked"]


def test_rate_is_a_percentage_with_one_decimal_or_a_dash_without_traffic() -> None:
    assert [_rate(1, 3), _rate(0, 5), _rate(5, 5), _rate(0, 0)] == ["33.3%", "0.0%", "100.0%", "-"]


def test_nothing_stored_reads_as_no_traffic() -> None:
    out = metrics("--hours", "1")
    assert re.search(r"^total\s+0\s+0\s+0\s+-\s+0$", out, re.M)
    assert "Per tier: no traffic" in out and "Blocked by policy: nothing blocked" in out
    assert "Top blocked: nothing blocked" in out
    assert "Degraded" not in out and "Shadow" not in out and "Allow/deny" not in out


@pytest.mark.django_db  # the names of API keys are read from the database
def test_shadow_limits_and_allow_deny_rules_get_their_own_lines(redis_client: redis.Redis, key_prefix: str) -> None:
    now = int(datetime.now(timezone.utc).timestamp()) // HOUR
    redis_client.hset(hour_key(key_prefix, now), mapping={
        "allowed": 4, "tier:pro:allowed": 4, "shadow:pro:dry": 3, "shadow:free:trial": 12,
        "allowed_by_list": 2, "denied_by_list": 1})
    redis_client.zadd(shadow_day_key(key_prefix, now // 24), {"key:abcd1234": 3})
    out = metrics("--hours", "1")
    lines = out.splitlines()
    start = lines.index("Shadow limits would have blocked:")
    assert lines[start + 1:start + 4] == ["  tier  policy  requests", "  free  trial         12",
                                          "  pro   dry            3"]
    assert "Top would-be-blocked (UTC days of the range):" in out
    assert re.search(r"^\s+key:abcd1234\s+3$", out, re.M)
    assert "Allow/deny rules: 2 allowed without limits, 1 refused (403)" in out


def test_the_hours_are_bounded_by_how_long_metrics_are_kept(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_TTL_HOURS": 6}
    assert len([line for line in metrics("--hours", "6").splitlines() if re.match(r"\d{4}-", line)]) == 6
    with pytest.raises(CommandError, match=r"--hours: 7 must be from 1 to 6 .* = 6 hours"):
        metrics("--hours", "7")


def test_a_redis_that_does_not_answer_is_a_clear_error(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    with pytest.raises(CommandError, match=r"Redis did not answer \(ConnectionError: "):
        metrics("--hours", "1")
    with pytest.raises(CommandError, match="Redis did not answer"):
        metrics("--json")


@pytest.mark.django_db
def test_a_blocked_api_key_is_shown_with_its_name(redis_client: redis.Redis, key_prefix: str) -> None:
    from ratelimit_app.models import ApiKey, Tier
    from tests.support.limits_support import seed_tiers

    seed_tiers()
    api_key, _ = ApiKey.objects.create_key(name="billing export", tier=Tier.objects.get(slug="free"))
    now = int(datetime.now(timezone.utc).timestamp()) // HOUR
    redis_client.hset(hour_key(key_prefix, now), mapping={"blocked": 7, "tier:free:blocked": 7})
    redis_client.zadd(day_key(key_prefix, now // 24),
                      {f"key:{api_key.prefix}": 5, "key:gone1234": 1, "ip:192.0.2.7": 1})
    out = metrics("--hours", "1")
    assert re.search(rf"^\s+key:{api_key.prefix} \(billing export\)\s+5$", out, re.M)
    assert re.search(r"^\s+key:gone1234\s+1$", out, re.M)  # a key deleted since: its prefix alone
    assert re.search(r"^\s+ip:192\.0\.2\.7\s+1$", out, re.M)
