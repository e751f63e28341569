"""The admin's tier, key and user tier pages in a real headless Chromium, in a 1,366 px window (a common
laptop screen): nothing wider than the window, every limit's number whole in its box (1000000 is not cut
to 100000; 1000000000 and a 366-day period neither), and a concurrency limit said as "50 at once", not as
a rate. Screenshots land in test-artifacts/admin-*.png. Skipped, or failed under
RATELIMIT_REQUIRE_BROWSER=1, as tests/observability/test_dashboard_browser.py is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from django.db import connections

from ratelimit_app.models import ApiKey, ApiKeyLimit, UserTier, UserTierLimit
from tests.observability.test_dashboard_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, MISSING, REQUIRE_BROWSER
from tests.support.limits_support import make_tier

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.skipif(MISSING is not None and not REQUIRE_BROWSER,
                                reason=f"browser test skipped: {MISSING}")

WINDOW = 1366

#: The number boxes of limit rows (tier limits and overrides), and how wide each one's text is.
NUMBER_BOXES = """() => Array.from(document.querySelectorAll(
    "input[name$='-limit'], input[name$='-period'], input[name$='-burst']"))
  .filter(box => !box.name.includes('__prefix__'))
  .map(box => ({name: box.name, value: box.value, text: box.scrollWidth, box: box.clientWidth}))"""


def check_page(page: Page, url: str, screenshot: str) -> list[dict[str, Any]]:
    """Open `url`, take its screenshot, and check that it fits the window and shows every number whole;
    the number boxes."""
    page.goto(url)
    page.screenshot(path=str(ARTIFACTS / f"admin-{screenshot}.png"), full_page=True)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= WINDOW, f"{screenshot}: the page is {width} px wide in a {WINDOW} px window"
    boxes = page.evaluate(NUMBER_BOXES)
    cut = [box for box in boxes if box["text"] > box["box"]]
    assert not cut, f"{screenshot}: numbers cut in their boxes: {cut}"
    return boxes


def test_tier_and_key_pages_fit_the_window_and_show_every_limit_whole(
        live_server: Any, transactional_db: Any, django_user_model: Any, monkeypatch: Any) -> None:
    if MISSING is not None:
        pytest.fail(f"RATELIMIT_REQUIRE_BROWSER=1, but {MISSING}")
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # the ORM reads while Playwright's loop runs
    staff = django_user_model.objects.create_superuser(username="ops", password="ops-password-123",
                                                        email="ops@example.com")
    tier = make_tier("wholesale", [
        ("burst", "token_bucket", 1000000, 86400, 1000000, ""),
        ("month", "fixed_window", 1000000, 2678400, None, ""),
        ("concurrency", "concurrency", 50, 60, None, ""),
        ("write", "fixed_window", 1000000000, 31622400, None, "uploads"),  # the largest limit and period
    ])
    api_key, _ = ApiKey.objects.create_key(name="Acme wholesale importer", tier=tier)
    ApiKeyLimit.objects.create(api_key=api_key, name="month", algorithm="fixed_window", limit=2500000,
                               period=2678400)
    user_tier = UserTier.objects.create(user=staff, tier=tier)
    UserTierLimit.objects.create(user_tier=user_tier, name="concurrency", algorithm="concurrency", limit=80,
                                 period=60)
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": WINDOW, "height": 900})
            page.goto(f"{live_server.url}/admin/")
            page.fill("#id_username", "ops")
            page.fill("#id_password", "ops-password-123")
            page.click("input[type=submit]")
            admin = f"{live_server.url}/admin/ratelimit_app"

            boxes = check_page(page, f"{admin}/tier/{tier.pk}/change/", "tier")
            assert {box["value"] for box in boxes if box["name"].endswith("-limit")} == {
                "1000000", "50", "1000000000"}
            assert "concurrency: 50 at once" in check_page_text(page, f"{admin}/tier/", "tiers")

            boxes = check_page(page, f"{admin}/apikey/{api_key.pk}/change/", "key")
            assert [box["value"] for box in boxes if box["name"].endswith("-limit")] == ["2500000"]
            effective = page.locator(".rl-effective-limits").inner_text()
            assert "50 at once" in effective and "/m" not in effective.split("concurrency")[1].splitlines()[0]
            assert "2500000 per" in effective or "2500000/" in effective

            check_page(page, f"{admin}/usertier/{user_tier.pk}/change/", "user-tier")
            assert "80 at once" in page.locator(".rl-effective-limits").inner_text()
        finally:
            browser.close()
            connections.close_all()  # see tests/test_plans_browser.py
    for name in ("tier", "tiers", "key", "user-tier"):
        assert (ARTIFACTS / f"admin-{name}.png").stat().st_size > 10_000


def check_page_text(page: Page, url: str, screenshot: str) -> str:
    """`check_page`, then the page's text."""
    check_page(page, url, screenshot)
    return page.locator("#content").inner_text()
