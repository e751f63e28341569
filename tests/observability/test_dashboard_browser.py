"""The dashboard in a real headless Chromium: log in as staff, open it, see the traffic the test sent.

Chromium comes from the system packages (/usr/bin/chromium, or the path in RATELIMIT_CHROMIUM; `.ci/run`
installs it) and is driven by Playwright's Python package, never by a browser Playwright downloads. The
screenshot lands in test-artifacts/dashboard.png (docs/img/dashboard.png is a copy of one).

On a machine without Chromium (or Playwright) the test is skipped, with the reason in pytest's summary.
With RATELIMIT_REQUIRE_BROWSER=1 (set by `.ci/run`) it fails instead: CI must run it.
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import shutil
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from ratelimit_app.models import ApiKey, Tier
from ratelimit_app.observability.recorder import flush
from ratelimit_app.observability.schema import hour_key
from tests.support.limits_support import seed_tiers

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("RATELIMIT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
REQUIRE_BROWSER = os.environ.get("RATELIMIT_REQUIRE_BROWSER") == "1"


def browser_missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"no Chromium at {CHROMIUM} (`apt-get install -y chromium`, or set RATELIMIT_CHROMIUM)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed (requirements-dev.txt)"
    return None


MISSING = browser_missing()
pytestmark = pytest.mark.skipif(MISSING is not None and not REQUIRE_BROWSER,
                                reason=f"browser test skipped: {MISSING}")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
DASHBOARD = "/admin/ratelimit_app/dashboard/"


def send_requests(base_url: str, key: str, count: int) -> dict[int, int]:
    """GET /api/users `count` times with `key` over real HTTP; status code -> responses."""
    parts = urlsplit(base_url)
    statuses: dict[int, int] = {}
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        for _ in range(count):
            connection.request("GET", "/api/users", headers={"X-API-Key": key})
            response = connection.getresponse()
            response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
    finally:
        connection.close()
    return statuses


def seed_history(client: redis.Redis, prefix: str) -> int:
    """Earlier hours of traffic (2 to 46 hours ago) written as the flusher would, so the chart has a shape;
    returns how many requests they hold. The chart shows 48 hours: should the hour turn before the page is
    drawn, the oldest of them is still on it."""
    now = int(time.time()) // 3600
    total = 0
    for back in range(2, 47):
        allowed = 40 + (back * 37) % 90
        blocked = (back * 13) % 25 if back % 3 else 0
        client.hset(hour_key(prefix, now - back), mapping={
            "allowed": allowed, "blocked": blocked, "tier:pro:allowed": allowed, "tier:pro:blocked": blocked,
            "policy:minute:blocked": blocked,
        })
        total += allowed + blocked
    return total


def test_staff_log_in_and_the_chart_shows_the_traffic_sent(
    live_server: Any, transactional_db: Any, django_user_model: Any, redis_client: redis.Redis, key_prefix: str
) -> None:
    if MISSING is not None:
        pytest.fail(f"RATELIMIT_REQUIRE_BROWSER=1, but {MISSING}")
    from django.contrib.auth.models import Permission
    from playwright.sync_api import sync_playwright

    staff = django_user_model.objects.create_user(username="ops", password="ops-password-123", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_apikey"))
    seed_tiers()  # an earlier transactional test may have flushed the seeded tiers
    _, key = ApiKey.objects.create_key(name="Browser test key", tier=Tier.objects.get(slug="free"))
    history = seed_history(redis_client, key_prefix)
    # The free tier admits a burst of 10: 25 rapid requests are 10 allowed and 15 refused.
    statuses = send_requests(live_server.url, key, 25)
    assert statuses == {200: 10, 429: 15}
    assert flush()

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            page.goto(f"{live_server.url}/admin/")
            page.fill("#id_username", "ops")
            page.fill("#id_password", "ops-password-123")
            page.click("input[type=submit]")
            page.click("#ratelimit-dashboard-link a >> text=Dashboard")
            page.wait_for_selector("#rl-chart")
            assert page.url == f"{live_server.url}{DASHBOARD}"

            # The two newest bars hold what the test sent (two only if the hour turned meanwhile).
            bars = page.locator("#rl-chart g.rl-hour")
            assert bars.count() == 48
            newest = [bars.nth(i) for i in (46, 47)]
            sent = [(int(b.get_attribute("data-allowed") or 0), int(b.get_attribute("data-blocked") or 0))
                    for b in newest]
            assert (sum(a for a, _ in sent), sum(b for _, b in sent)) == (10, 15)
            assert page.inner_text("#rl-total") == f"{history + 25:,}"

            # ... and the browser draws them: bar heights in pixels match the counts.
            bar = newest[1] if sent[1][0] else newest[0]
            allowed, blocked = sent[1] if sent[1][0] else sent[0]
            allowed_box = bar.locator("rect.rl-bar-allowed").bounding_box()
            blocked_box = bar.locator("rect.rl-bar-blocked").bounding_box()
            chart_box = page.locator("#rl-chart").bounding_box()
            assert allowed_box and blocked_box and chart_box
            assert allowed_box["height"] > 2 and blocked_box["height"] > 2
            assert blocked_box["height"] / allowed_box["height"] == pytest.approx(blocked / allowed, rel=0.05)
            assert blocked_box["y"] + blocked_box["height"] == pytest.approx(allowed_box["y"], abs=1)
            assert chart_box["y"] <= blocked_box["y"] and allowed_box["y"] + allowed_box["height"] <= \
                chart_box["y"] + chart_box["height"]
            assert "10 allowed, 15 blocked" in (bar.locator("title").text_content() or "")

            # The key that was refused is listed with a link to its admin page.
            prefix = key.partition(".")[0]
            link = page.locator(f"#rl-top-blocked a:has-text('key:{prefix}')")
            assert link.count() == 1
            assert "/admin/ratelimit_app/apikey/" in (link.get_attribute("href") or "")
            assert key not in page.content()

            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            link.click()
            page.wait_for_selector("#apikey_form")
            assert "Browser test key" in page.content()
        finally:
            browser.close()
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000
