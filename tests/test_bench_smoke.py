"""The benchmark runs end to end on a tiny size (numbers are not checked: timing belongs to bench/ only)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gateways import missing_gateways

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
                    "## 4. HTTP: a trivial view under gunicorn", "## 5. Redis time per decision",
                    "## 6. HTTP under ASGI (uvicorn)"):
        assert section in report
    # ours and the baseline always run; every target row carries a verdict
    assert "| **ours: free tier (3 policies)** |" in report
    assert "| baseline: bare EVALSHA of INCR (client.evalsha) |" in report
    assert "| **ratelimit_app middleware** |" in report
    assert "| **ratelimit_app middleware, async** |" in report
    # every value is filled in: a line of the report's text that lost its f-prefix shows its placeholders
    assert not re.findall(r"\{[a-z_.]+\}", report), re.findall(r".{60}\{[a-z_.]+\}.{20}", report)
    target_rows = report.split("## Targets")[1].split("## Machine")[0].splitlines()[4:]
    assert [row for row in target_rows if row.startswith("| 3-policy tier >= 0.9x")]
    verdicts = [row.rstrip(" |").rsplit("|", 1)[1].split(" (noisy")[0].strip()
                for row in target_rows if row.startswith("|")]
    assert verdicts and all(v in ("**pass**", "**MISS**", "not yet available") for v in verdicts), verdicts
    assert (tmp_path / "img" / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (docs_report.read_bytes() if docs_report.exists() else None) == before


@pytest.mark.slow
def test_asgi_only_smoke_run_measures_every_asgi_row_without_errors(tmp_path: Path) -> None:
    """`--asgi-only` (section 6): the four variants under uvicorn and the async engine's rows, every
    request answered 200, written as the ASGI section alone."""
    done = subprocess.run([sys.executable, "bench/run.py", "--smoke", "--asgi-only", "--output", str(tmp_path),
                           "--json", str(tmp_path / "asgi.json")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    section = json.loads((tmp_path / "asgi.json").read_text(encoding="utf-8"))
    rows = {row["variant"]: row for row in section["http"]["results"]}
    assert list(rows) == ["async-none", "async-evalsha", "async-ours", "sync-ours"]
    assert all(row["requests"] > 0 and row["errors"] == 0 for row in rows.values()), rows
    assert "ratelimit" in " ".join(section["http"]["ours_headers"]).lower()  # our middleware did decide
    assert set(section["transports"]["per_second"]) == {"async.evalsha/1", "async.tier/1", "async.evalsha/16",
                                                        "async.tier/16"}
    report = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    assert report.startswith("<!-- section: asgi -->\n## 6. HTTP under ASGI (uvicorn)")
    verdicts = [line.rstrip(" |").rsplit("|", 1)[1].split(" (noisy")[0].strip()
                for line in report.split("| target |")[1].split("\n\n")[0].splitlines()[2:]]
    assert len(verdicts) == 4 and all(v in ("**pass**", "**MISS**") for v in verdicts), verdicts


@pytest.mark.slow
def test_memory_only_smoke_run_replaces_section_3_and_its_targets_alone(tmp_path: Path) -> None:
    """`--memory-only` (section 3) on a copy of docs/benchmarks.md: section 3 and the memory targets' rows
    are rewritten in place, every other line of the file stays as it was."""
    before = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    (tmp_path / "benchmarks.md").write_text(before, encoding="utf-8")
    done = subprocess.run([sys.executable, "bench/run.py", "--smoke", "--memory-only", "--output", str(tmp_path),
                           "--json", str(tmp_path / "memory.json")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "memory.json").read_text(encoding="utf-8"))
    log = next(r for r in rows if r["variant"] == "ours.sliding_window" and r["rate"]["limit"] == 2000)
    assert (log["keys_per_identity"], log["live_identities"]) == (2, log["identities"])
    after = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")

    def outside_memory(text: str) -> list[str]:
        head, _, rest = text.partition("<!-- section: memory -->")
        return [line for line in head.splitlines() if not line.startswith(("| exact sliding log", "| O(1) algo"))] \
            + rest.partition("<!-- end of section -->")[2].splitlines()

    assert outside_memory(after) == outside_memory(before)
    assert after.count("## 3. Redis memory per active identity") == 1
    section = after.partition("<!-- section: memory -->")[2].partition("<!-- end of section -->")[0]
    assert "Measured on its own by `python bench/run.py --smoke --memory-only" in section
    assert "| **ours: sliding_window** | 2000/m |" in section
    target_rows = [line for line in after.split("## Targets")[1].split("## Machine")[0].splitlines()
                   if line.startswith("| exact sliding log <= 8.5 bytes per unit of limit at 2000/m |")]
    assert len(target_rows) == 1
    assert f"| {log['memory_usage_per_identity'] / log['filled_to']:.2f} bytes per unit (" in target_rows[0]


@pytest.mark.slow
@pytest.mark.skipif(missing_gateways() is not None and os.environ.get("RATELIMIT_REQUIRE_GATEWAYS") != "1",
                    reason=f"gateways: {missing_gateways()}")
def test_gateway_bench_measures_every_row_without_refusals(tmp_path: Path) -> None:
    """bench/gateway_bench.py on a tiny size: nginx without auth_request, with a bare auth_request to one
    EVALSHA, and with the documented gateway endpoint (with and without a slot), every answer 200."""
    done = subprocess.run([sys.executable, "bench/gateway_bench.py", "--duration", "1", "--warmup", "0",
                           "--rounds", "1", "--connections", "2", "--workers", "1", "--threads", "2",
                           "--json", str(tmp_path / "gateway.json")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads((tmp_path / "gateway.json").read_text(encoding="utf-8"))
    assert [row["label"] for row in rows] == ["no auth_request", "bare auth_request (the floor)", "gateway endpoint",
                                              "gateway endpoint + slot"]
    assert all(r["requests"] > 0 and r["errors"] == 0 for row in rows for r in row["results"]), rows
    assert "| gateway endpoint + slot |" in done.stdout


def test_every_part_of_the_asgi_profile_names_files_that_exist() -> None:
    """A marker of bench/asgi_profile.PARTS that names no file of the package any more (a module moved)
    would send its samples to another part without a word."""
    from bench.asgi_profile import PARTS, part_of

    files = [str(path.relative_to(ROOT)) for path in (ROOT / "ratelimit_app").rglob("*.py")]
    stale = [marker for _, markers in PARTS for marker in markers
             if marker.startswith("ratelimit_app/") and not any(marker in name for name in files)]
    assert stale == []
    plan_part = PARTS[1][0]
    for module in ("plans/lookups.py", "core/apikeys.py", "apply/planning.py", "apply/planning_async.py"):
        assert part_of([f"{ROOT}/ratelimit_app/{module}:10 (f)"]) == plan_part, module
