"""`manage.py check` of the DRF throttles (ratelimit_app.throttling_checks) in fresh processes: registered by
the app itself in any project that installs it, and never importing DRF in a project without it. The
checks' cases are tested beside the throttles they look at (tests/test_throttling.py, test_drf_compat.py,
apply/test_protection.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _fresh_project(tmp_path: Path, settings: str, urls: str = "urlpatterns = []\n") -> Path:
    """A project of its own in `tmp_path` (settings.py, urls.py, views.py) that installs ratelimit_app."""
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "__init__.py").write_text("")
    (tmp_path / "fresh" / "urls.py").write_text(textwrap.dedent(urls))
    (tmp_path / "fresh" / "settings.py").write_text(textwrap.dedent("""
        SECRET_KEY = "fresh-project-for-tests-only"
        DEBUG = True
        INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "ratelimit_app"]
        ROOT_URLCONF = "fresh.urls"
        DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
        RATELIMIT = {"BACKEND": "memory"}
    """) + textwrap.dedent(settings))
    return tmp_path


def _check(project: Path, *prelude: str) -> subprocess.CompletedProcess[str]:
    """`manage.py check` of `project` in a fresh process (after `prelude`, lines of Python run first)."""
    program = "\n".join([*prelude, "from django.core.management import execute_from_command_line",
                         "execute_from_command_line(['manage.py', 'check'])"])
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{project}{':'}{ROOT}", "DJANGO_SETTINGS_MODULE": "fresh.settings"}
    return subprocess.run([sys.executable, "-c", program], cwd=project, env=env, capture_output=True, text=True,
                          timeout=60)


def test_check_runs_the_drf_throttle_checks_in_a_fresh_project(tmp_path: Path) -> None:
    # Nothing in this project imports ratelimit_app.throttling before `check` runs: the checks of the
    # throttles it names are registered by the app itself.
    project = _fresh_project(tmp_path, """
        REST_FRAMEWORK = {
            "DEFAULT_THROTTLE_CLASSES": ["ratelimit_app.throttling.AnonRateThrottle"],
            "DEFAULT_THROTTLE_RATES": {"anon": "six/m"},
        }
    """)
    done = _check(project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ratelimit.E010" in done.stderr
    assert "REST_FRAMEWORK['DEFAULT_THROTTLE_RATES']['anon'] = 'six/m' is not a rate" in done.stderr


def test_check_finds_the_throttles_of_views_in_a_fresh_project(tmp_path: Path) -> None:
    project = _fresh_project(tmp_path, 'REST_FRAMEWORK = {"NUM_PROXIES": 0}\n', urls="""
        from django.urls import path
        from rest_framework.response import Response
        from rest_framework.views import APIView

        from ratelimit_app.throttling import ScopedRateThrottle


        class Search(APIView):
            throttle_classes = [ScopedRateThrottle]
            throttle_scope = "search"

            def get(self, request):
                return Response({})


        urlpatterns = [path("search", Search.as_view())]
    """)
    done = _check(project)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ratelimit.E011" in done.stderr and "Search.throttle_scope = 'search' has no rate" in done.stderr


def test_check_needs_no_drf_where_it_is_not_installed(tmp_path: Path) -> None:
    project = _fresh_project(tmp_path, "")
    # rest_framework cannot be imported in this process, as in a project that does not install it
    done = _check(project, "import sys", "sys.modules['rest_framework'] = None")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_check_says_nothing_of_proxies_where_none_of_our_throttles_is_used(tmp_path: Path) -> None:
    # DRF installed, its own throttles or none: how ours would tell clients apart is not this project's concern
    project = _fresh_project(tmp_path, 'REST_FRAMEWORK = {"DEFAULT_THROTTLE_RATES": {"anon": "10/m"}}\n')
    done = _check(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ratelimit.W011" not in done.stdout + done.stderr
