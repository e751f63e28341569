"""docs/plans.md, walked in a real headless Chromium: staff add a shadow limit, watch the dashboard,
give one key more than its plan, set a monthly quota in a time zone and list networks and keys, each
through the admin's own pages. The screenshots land in test-artifacts/plans-*.png (docs/img/ holds
copies of one run). Skipped, or failed under RATELIMIT_REQUIRE_BROWSER=1, as test_dashboard_browser is."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connections

from ratelimit_app.models import ApiKey, ApiKeyLimit, ClientRule, Tier, TierLimit
from ratelimit_app.observability.recorder import flush
from tests.observability.test_dashboard_browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    DASHBOARD,
    MISSING,
    REQUIRE_BROWSER,
    send_requests,
)
from tests.support.limits_support import seed_tiers

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.skipif(MISSING is not None and not REQUIRE_BROWSER,
                                reason=f"browser test skipped: {MISSING}")


def add_inline_row(page: Page, prefix: str, values: dict[str, str], checks: tuple[str, ...] = ()) -> None:
    """Click the inline's "Add another" link and fill the new row, as staff do."""
    rows = int(page.input_value(f"#id_{prefix}-TOTAL_FORMS"))
    page.click(f"#{prefix}-group .add-row a")
    for name, value in values.items():
        field = page.locator(f"[name='{prefix}-{rows}-{name}']")
        if field.evaluate("element => element.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    for name in checks:
        page.check(f"[name='{prefix}-{rows}-{name}']")


def save(page: Page) -> None:
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")


def test_staff_run_plans_in_the_admin(live_server: Any, transactional_db: Any, django_user_model: Any,
                                      settings: Any, monkeypatch: Any) -> None:
    if MISSING is not None:
        pytest.fail(f"RATELIMIT_REQUIRE_BROWSER=1, but {MISSING}")
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), "no Chromium: `apt-get install -y chromium` (.ci/run does it)"
    # Playwright's sync API runs an event loop in this thread; the test's own ORM reads are synchronous
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_FLUSH_INTERVAL": 3600.0}
    django_user_model.objects.create_superuser(username="ops", password="ops-password-123", email="ops@example.com")
    seed_tiers()  # an earlier transactional test may have flushed the seeded tiers
    free = Tier.objects.get(slug="free")
    _, heavy = ApiKey.objects.create_key(name="Acme batch importer", tier=free)
    _, light = ApiKey.objects.create_key(name="Globex dashboard", tier=free)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{live_server.url}/admin/")
            page.fill("#id_username", "ops")
            page.fill("#id_password", "ops-password-123")
            page.click("input[type=submit]")

            # 1. A shadow limit on the free tier
            page.goto(f"{live_server.url}/admin/ratelimit_app/tier/{free.pk}/change/")
            add_inline_row(page, "limits", {"name": "minute-5", "algorithm": "sliding_window", "limit": "5",
                                            "period": "60"}, checks=("shadow",))
            page.screenshot(path=str(ARTIFACTS / "plans-shadow-admin.png"), full_page=True)
            save(page)
            assert TierLimit.objects.get(tier=free, name="minute-5").shadow

            assert send_requests(live_server.url, heavy, 8) == {200: 8}
            assert send_requests(live_server.url, light, 3) == {200: 3}
            assert flush()
            page.goto(f"{live_server.url}{DASHBOARD}?hours=6")
            shadow_panel = page.locator("#rl-shadow")
            assert "minute-5" in shadow_panel.inner_text() and "3" in shadow_panel.inner_text()
            assert f"key:{heavy.partition('.')[0]}" in page.locator("#rl-shadow-top").inner_text()
            panels = page.locator("#rl-shadow").locator("xpath=..")
            panels.screenshot(path=str(ARTIFACTS / "plans-shadow-dashboard.png"))

            # 2. An override: the heavy key gets 50 a minute
            heavy_key = ApiKey.objects.get(prefix=heavy.partition(".")[0])
            page.goto(f"{live_server.url}/admin/ratelimit_app/apikey/{heavy_key.pk}/change/")
            add_inline_row(page, "limits", {"name": "minute", "algorithm": "sliding_window", "limit": "50",
                                            "period": "60"})
            save(page)
            assert ApiKeyLimit.objects.get(api_key=heavy_key).limit == 50
            assert "override" in page.locator(".rl-effective-limits").inner_text()
            page.screenshot(path=str(ARTIFACTS / "plans-override.png"), full_page=True)

            # 3. A calendar quota: a metered tier, 10,000 a month in Paris
            page.goto(f"{live_server.url}/admin/ratelimit_app/tier/add/")
            page.fill("#id_name", "Metered")  # the slug follows the name
            page.fill("#id_time_zone", "Europe/Paris")
            add_inline_row(page, "limits", {"name": "month", "algorithm": "fixed_window", "limit": "10000",
                                            "period": "2678400", "calendar": "month"})
            page.screenshot(path=str(ARTIFACTS / "plans-calendar.png"), full_page=True)
            save(page)
            assert TierLimit.objects.get(tier__slug="metered").period == 31 * 86400

            # 4. Allow and deny lists
            page.goto(f"{live_server.url}/admin/ratelimit_app/clientrule/add/")
            page.select_option("#id_action", "allow")
            page.fill("#id_network", "10.20.0.0/16")
            page.fill("#id_note", "internal monitoring")
            page.click("input[name=_addanother]")
            page.wait_for_selector(".messagelist .success")
            page.select_option("#id_action", "deny")
            page.fill("#id_network", "203.0.113.0/24")
            page.fill("#id_note", "scraper, ticket OPS-42")
            page.click("input[name=_save]")
            page.wait_for_selector("#result_list")
            assert ClientRule.objects.count() == 2
            page.screenshot(path=str(ARTIFACTS / "plans-client-rules.png"), full_page=True)
        finally:
            browser.close()
            # The ORM reads above ran while Playwright's event loop ran in this thread, so Django's
            # connections (an asgiref Local, per context) gave them a connection of their own that nothing
            # else closes: left open, it keeps the test database from being dropped at the end of the run.
            connections.close_all()
    for name in ("shadow-admin", "shadow-dashboard", "override", "calendar", "client-rules"):
        assert (ARTIFACTS / f"plans-{name}.png").stat().st_size > 10_000
