"""bench/usage_bench.py runs end to end on a tiny size (its times are not checked, only what it counts: a
request that reserves and settles is two EVALSHA, a plain one is one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_the_usage_bench_counts_one_call_to_settle_and_none_more_for_a_plain_route() -> None:
    done = subprocess.run([sys.executable, "bench/usage_bench.py", "--calls", "200", "--rounds", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1]
            for line in done.stdout.splitlines() if line.startswith("| reserve") or line.startswith("| a plain")}
    assert rows == {"reserve 500 tokens, settle 10 (sliding_window 40,000/m, and the route's 2 limits)": "2.00",
                    "reserve 500 tokens, settle 10 (gcra 40,000/m, and the route's 2 limits)": "2.00",
                    "a plain hit of the same route (no usage limit)": "1.00"}
    assert "| before usage limits (" in done.stdout and "| now |" in done.stdout
