"""`ratelimit_app.ninja` without django-ninja installed: a clear error naming the extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_it_without_django_ninja_says_how_to_install_it() -> None:
    code = ("import sys\nsys.modules['ninja'] = None  # as if django-ninja were not installed\n"
            "try:\n    import ratelimit_app.ninja\nexcept Exception as exc:\n"
            "    print(type(exc).__name__, exc)\n")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert found.stdout.startswith("ImproperlyConfigured ratelimit_app.ninja needs django-ninja")
    assert "pip install 'django-ninja>=1.7'" in found.stdout
