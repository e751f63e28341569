"""The admin dashboard through the Django test client: access, content, links, failure display."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from devtools.embedded import free_port
from ratelimit_app.models import ApiKey, Tier
from ratelimit_app.observability.dashboard import _build_chart, _days
from ratelimit_app.observability.queries import HourMetrics, MetricsRange
from ratelimit_app.observability.recorder import flush, record_decision, record_usage

pytestmark = pytest.mark.django_db

URL = "/admin/ratelimit_app/dashboard/"


@pytest.fixture
def staff_user(django_user_model: Any) -> Any:
    """Staff allowed to view API keys in the admin."""
    user = django_user_model.objects.create_user(username="ops", password="pw-ops-1234", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_apikey"))
    return user


@pytest.fixture
def staff_client(client: Client, staff_user: Any) -> Client:
    client.force_login(staff_user)
    return client


def record(allowed: int, blocked: dict[tuple[str, str, str], int]) -> None:
    for _ in range(allowed):
        record_decision(allowed=True, tier="free", policy=None, degraded=False, identity="ip:192.0.2.1")
    for (tier, policy, identity), count in blocked.items():
        for _ in range(count):
            record_decision(allowed=False, tier=tier, policy=policy, degraded=False, identity=identity)
    assert flush()


def current_bar(html: str) -> dict[str, int]:
    """The last bar of the chart (the current hour) as data attributes."""
    bars = re.findall(r'data-allowed="(\d+)" data-blocked="(\d+)"', html)
    allowed, blocked = bars[-1]
    return {"bars": len(bars), "allowed": int(allowed), "blocked": int(blocked)}


def test_url_is_the_documented_one() -> None:
    assert reverse("ratelimit_dashboard") == URL


def test_anonymous_and_non_staff_users_are_sent_to_the_admin_login(client: Client, django_user_model: Any) -> None:
    response = client.get(URL)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    client.force_login(django_user_model.objects.create_user(username="user", password="pw-user-1234"))
    response = client.get(URL)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_staff_see_the_traffic_breakdowns_and_top_blocked_keys(staff_client: Client) -> None:
    api_key, _ = ApiKey.objects.create_key(name="Acme mobile app", tier=Tier.objects.get(slug="free"))
    record(30, {("free", "burst", f"key:{api_key.prefix}"): 8, ("ip", "ip", "ip:203.0.113.7"): 2,
                ("pro", "minute", "key:GoneKey1"): 1})
    response = staff_client.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    bar = current_bar(html)
    assert bar["bars"] == 48
    # the current hour holds everything (or, right after the hour turned, the one before it did)
    assert (bar["allowed"], bar["blocked"]) in ((30, 11), (0, 0))
    assert re.search(r'id="rl-total">41<', html) and re.search(r'id="rl-blocked">11<', html)
    assert 'id="rl-block-rate">26.8%<' in html
    tiers = re.findall(r"<tr><td>(\w+)</td><td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td>", html)
    assert tiers == [("free", "30", "8"), ("ip", "0", "2"), ("pro", "0", "1")]
    change_url = reverse("admin:ratelimit_app_apikey_change", args=[api_key.pk])
    assert f'<a href="{change_url}" title="API key Acme mobile app">key:{api_key.prefix}</a>' in html
    # an identity without an ApiKey row is listed without a link
    assert re.search(r"<td>key:GoneKey1</td>", html)
    assert "ip:203.0.113.7" in html
    assert "Limiter health" in html and 'class="rl-ok">up<' in html


def test_staff_without_api_key_permission_see_prefixes_without_links(client: Client, django_user_model: Any) -> None:
    api_key, _ = ApiKey.objects.create_key(name="Acme", tier=Tier.objects.get(slug="free"))
    record(0, {("free", "burst", f"key:{api_key.prefix}"): 2})
    client.force_login(django_user_model.objects.create_user(username="viewer", password="pw-1234-x", is_staff=True))
    html = client.get(URL).content.decode()
    assert f"<td>key:{api_key.prefix}</td>" in html and "/admin/ratelimit_app/apikey/" not in html


def test_link_from_the_admin_index_and_other_admin_pages_still_work(staff_client: Client, admin_user: Any) -> None:
    index = staff_client.get("/admin/")
    assert index.status_code == 200
    assert f'<a href="{URL}">Dashboard</a>' in index.content.decode()
    staff_client.force_login(admin_user)
    for page in ("/admin/", "/admin/ratelimit_app/", "/admin/ratelimit_app/apikey/", "/admin/ratelimit_app/tier/",
                 "/admin/auth/user/", "/admin/password_change/"):
        assert staff_client.get(page).status_code == 200, page


def test_hours_are_chosen_and_validated(staff_client: Client) -> None:
    assert current_bar(staff_client.get(URL, {"hours": "6"}).content.decode())["bars"] == 6
    for bad in ("0", "49", "x"):
        response = staff_client.get(URL, {"hours": bad})
        assert response.status_code == 400
        assert "hours must be a whole number from 1 to 48" in response.content.decode()


def test_the_page_loads_nothing_from_other_sites(staff_client: Client) -> None:
    html = staff_client.get(URL).content.decode()
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<script" not in html.replace('<script src="/static/admin/', "")


def test_redis_down_is_shown_not_raised(staff_client: Client, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    response = staff_client.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="rl-down">down<' in html
    assert "Metrics are unavailable: Redis did not answer" in html


def test_degraded_decisions_and_breaker_state_are_shown(staff_client: Client) -> None:
    for _ in range(3):
        record_decision(allowed=True, tier="free", policy=None, degraded=True, identity="ip:192.0.2.1")
    record_decision(allowed=False, tier="free", policy="day", degraded=True, identity="ip:192.0.2.1")
    assert flush()
    html = staff_client.get(URL).content.decode()
    assert re.search(r'id="rl-degraded">4<', html) and "(1 refused)" in html
    assert 'id="rl-breaker">closed<' in html


def hour(index: int, allowed: int, blocked: int) -> HourMetrics:
    start = datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(hours=index)
    return HourMetrics(allowed=allowed, blocked=blocked, hour=start, degraded=0, degraded_blocked=0,
                       tiers=(), policies=())


def test_chart_bars_are_proportional_to_the_counts() -> None:
    chart = _build_chart([hour(0, 30, 10), hour(1, 0, 0), hour(2, 75, 0)])
    first, empty, third = chart.bars
    assert chart.max_value >= 75 and chart.y_ticks[0][1] == "0" and chart.y_ticks[-1][1] == f"{chart.max_value:,}"
    assert first.allowed_height == pytest.approx(3 * first.blocked_height, rel=0.01)
    assert third.allowed_height == pytest.approx(75 / 30 * first.allowed_height, rel=0.01)
    assert empty.allowed_height == empty.blocked_height == 0
    # blocked sits on top of allowed, and every bar stands on the axis
    assert first.blocked_y + first.blocked_height == pytest.approx(first.allowed_y)
    assert first.allowed_y + first.allowed_height == pytest.approx(chart.bottom)
    assert first.x < empty.x < third.x
    assert [text for _, text in chart.x_ticks] == ["Jan 01"]



@pytest.mark.parametrize(("hours", "shown"), [(1, "Jan 01"), (24, "Jan 01"), (25, "Jan 01 \N{EN DASH} Jan 02"),
                                              (744, "Jan 01 \N{EN DASH} Jan 31")])
def test_the_top_lists_name_the_utc_days_they_sum(hours: int, shown: str) -> None:
    start = hour(0, 0, 0).hour
    summary = MetricsRange(allowed=0, blocked=0, start=start, end=start + timedelta(hours=hours - 1), hours=(),
                           degraded=0, degraded_blocked=0, tiers=(), policies=(), top_blocked=())
    assert _days(summary) == shown

@pytest.mark.parametrize(("required", "outcome"), [(False, "1 skipped"), (True, "1 failed")])
def test_without_chromium_the_browser_test_is_skipped_with_its_reason_unless_required(
    required: bool, outcome: str
) -> None:
    env = {**os.environ, "RATELIMIT_CHROMIUM": "/nonexistent/chromium"}
    env.pop("RATELIMIT_REQUIRE_BROWSER", None)
    env.pop("DATABASE_URL", None)  # SQLite: the parent run's PostgreSQL test database is in use
    if required:
        env["RATELIMIT_REQUIRE_BROWSER"] = "1"  # what .ci/run sets
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "tests/observability/test_dashboard_browser.py"],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True,
                          timeout=300)
    assert outcome in done.stdout
    assert "no Chromium at /nonexistent/chromium" in done.stdout
    assert done.returncode == (1 if required else 0)


@pytest.mark.parametrize(("name", "value", "shown"), [
    ("IP_RATE", "lots", None),
    ("METRICS_TTL_HOURS", 0, "RATELIMIT['METRICS_TTL_HOURS'] is invalid"),
    ("KEY_PREFIX", "", "RATELIMIT['KEY_PREFIX'] is invalid"),
    ("METRICS_FLUSH_INTERVAL", -1, "RATELIMIT['METRICS_FLUSH_INTERVAL'] is invalid"),
])
def test_an_invalid_ratelimit_is_shown_on_the_dashboard_not_raised(staff_client: Client, settings: Any, name: str,
                                                                   value: Any, shown: str | None) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, name: value}
    response = staff_client.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    if shown is None:
        assert 'id="rl-summary"' in html and 'id="rl-error"' not in html
    else:
        assert 'id="rl-error"' in html and shown.replace("'", "&#x27;") in html and "manage.py check" in html


def test_units_used_under_usage_limits_are_shown_per_tier_and_policy(staff_client: Client) -> None:
    record_usage(tier="pro", used=(("llm.tokens", "tokens", 100), ("llm.day", "tokens", 100)))
    record_usage(tier="pro", used=(("llm.tokens", "tokens", 42),))
    assert flush()
    html = staff_client.get(URL).content.decode()
    rows = re.findall(r"<tr><td>(\w+)</td><td>([\w.]+)</td><td>(\w+)</td><td class=\"num\">(\d+)</td>", html)
    # the current hour holds them (or, right after the hour turned, the one before it did)
    assert rows == [("pro", "llm.tokens", "tokens", "142"), ("pro", "llm.day", "tokens", "100")]
    assert 'id="rl-usage"' in html
