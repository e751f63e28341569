"""The pytest plugin: registered by the package (entry point pytest11), and inert until a test asks for
the `ratelimit` fixture."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from ratelimit_app.conf import settings as conf
from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.service import clock
from ratelimit_app.testing import IsolatedRateLimit, plugin

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_registers_the_plugin(request: pytest.FixtureRequest) -> None:
    registered = {entry.name: entry.value for entry in entry_points(group="pytest11")}
    assert registered.get("ratelimit_app") == "ratelimit_app.testing.plugin"
    assert request.config.pluginmanager.get_plugin("ratelimit_app") is plugin


def test_the_plugin_defines_a_fixture_and_no_hook() -> None:
    assert [name for name in vars(plugin) if name.startswith("pytest_")] == []


def test_a_test_without_the_fixture_runs_on_the_projects_settings(settings: object) -> None:
    assert conf.set_overlay({}) == {} and clock.offset_ms() == 0
    assert ratelimit_settings.KEY_PREFIX.startswith("rltest-") and ratelimit_settings.CLOCK_SHIFT is False


def test_the_fixture_is_an_isolated_state(ratelimit: IsolatedRateLimit) -> None:
    assert ratelimit_settings.KEY_PREFIX == ratelimit.prefix and ratelimit_settings.CLOCK_SHIFT is True


def test_importing_the_kit_needs_no_settings(tmp_path: Path) -> None:
    """pytest imports the plugin before Django is configured: nothing of the kit may need settings then."""
    code = textwrap.dedent("""
        import sys
        import ratelimit_app.testing.plugin
        from django.conf import settings
        assert not settings.configured
        print(sorted(m for m in sys.modules if m.startswith("ratelimit_app.") and ".testing" not in m
                     and not m.startswith("ratelimit_app.core")))
    """)
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                           env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, check=True)
    assert found.stdout.strip() == "[]"
