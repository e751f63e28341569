"""DRF's own `tests/test_throttling.py`, fetched from DRF's source distribution at test time: nothing of
DRF's code is kept in this repository.

`drf_throttling_tests()` downloads the sdist of djangorestframework DRF_VERSION from the package index
with pip (the project's pip configuration applies: index, mirror, proxy), in hash-checking mode against
DRF_SDIST_SHA256, into a temporary folder removed when the process exits; extracts that one file; and
imports it as a module. DRF_VERSION is the newest release whose sdist ships the file that runs against
the DRF the suite installs (requirements.txt); a download or hash failure fails the suite.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import subprocess
import sys
import tarfile
import tempfile
from functools import cache
from pathlib import Path
from types import ModuleType

DRF_VERSION = "3.18.3"
DRF_SDIST_SHA256 = "446a9b352e7eff630421ab3f2328bd2401b109a9470afa4a31189994911ed030"
MEMBER = f"djangorestframework-{DRF_VERSION}/tests/test_throttling.py"
MODULE_NAME = "tests.drf_suite.drf_test_throttling"


@cache
def drf_throttling_tests() -> ModuleType:
    """DRF's tests/test_throttling.py of DRF_VERSION, imported (once per process)."""
    folder = Path(tempfile.mkdtemp(prefix="drf-suite-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    requirement = folder / "requirement.txt"
    requirement.write_text(f"djangorestframework=={DRF_VERSION} --hash=sha256:{DRF_SDIST_SHA256}\n")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                    "--no-binary", ":all:", "--require-hashes", "-r", str(requirement), "-d", str(folder)],
                   check=True)
    with tarfile.open(folder / f"djangorestframework-{DRF_VERSION}.tar.gz") as sdist:
        source = sdist.extractfile(MEMBER)
        if source is None:
            raise FileNotFoundError(f"{MEMBER} is not a file in DRF's sdist")
        path = folder / "test_throttling.py"
        path.write_bytes(source.read())
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module
