"""What the app does when Django starts it (`RateLimitConfig.ready()`), and nothing it does at import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from django.contrib import admin
from django.contrib.admin import AdminSite

from ratelimit_app.observability.dashboard import _INDEX_TEMPLATE, install_admin_link

ROOT = Path(__file__).resolve().parent.parent


def test_ready_links_the_dashboard_from_the_default_admin_site() -> None:
    assert admin.site.index_template == _INDEX_TEMPLATE


def test_a_site_with_its_own_index_template_keeps_it() -> None:
    site = AdminSite(name="custom")
    site.index_template = "custom/index.html"
    install_admin_link(site)
    assert site.index_template == "custom/index.html"


def test_importing_the_dashboard_changes_no_admin_site() -> None:
    # In a fresh process where ratelimit_app is not an installed app: the import alone must not touch
    # the default admin site (the link is the AppConfig's job).
    program = textwrap.dedent("""
        import django
        from django.conf import settings
        settings.configure(INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth",
                                           "django.contrib.contenttypes", "django.contrib.sessions",
                                           "django.contrib.messages"])
        django.setup()
        from django.contrib import admin
        import ratelimit_app.observability.dashboard
        print(repr(admin.site.index_template))
    """)
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
