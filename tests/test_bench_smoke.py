"""The benchmark runs end to end on a tiny size (numbers are not checked: timing belongs to bench/ only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_smoke_run_writes_the_report_and_chart_without_touching_docs(tmp_path: Path) -> None:
    docs_report = ROOT / "docs" / "benchmarks.md"
    before = docs_report.read_bytes() if docs_report.exists() else None

    done = subprocess.run([sys.executable, "bench/run.py", "--smoke", "--output", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    for section in ("## Targets", "## Machine and versions", "## 1. Decisions per second",
                    "## 2. Accuracy under concurrency", "## 3. Redis memory per active identity",
                    "## 4. HTTP: a trivial view under gunicorn", "## 5. Redis time per decision"):
        assert section in report
    # ours and the baseline always run; every target row carries a verdict
    assert "| **ours: free tier (3 policies)** |" in report
    assert "| baseline: bare EVALSHA of INCR (client.evalsha) |" in report
    assert "| **ratelimit_app middleware** |" in report
    target_rows = report.split("## Targets")[1].split("## Machine")[0].splitlines()[4:]
    assert [row for row in target_rows if row.startswith("| 3-policy tier >= 0.9x")]
    verdicts = [row.rstrip(" |").rsplit("|", 1)[1].split(" (noisy")[0].strip()
                for row in target_rows if row.startswith("|")]
    assert verdicts and all(v in ("**pass**", "**MISS**", "not yet available") for v in verdicts), verdicts
    assert (tmp_path / "img" / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (docs_report.read_bytes() if docs_report.exists() else None) == before
