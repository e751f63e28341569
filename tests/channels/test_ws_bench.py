"""bench/ws_bench.py runs end to end on a tiny size (its numbers are not checked, except what it counts: a
message through the limiter is one EVALSHA, a message without it none)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_the_websocket_bench_measures_both_consumers(tmp_path: Path) -> None:
    results = tmp_path / "ws.json"
    done = subprocess.run([sys.executable, "bench/ws_bench.py", "--duration", "0.5", "--rounds", "1",
                           "--connections", "2", "--json", str(results)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| through the limiter |" in done.stdout and "| without the limiter |" in done.stdout
    measured = json.loads(results.read_text())
    assert all(rate > 0 for rates in measured["rates"].values() for rate in rates)
    per_message = measured["evalsha_per_message"]
    assert per_message["without the limiter"][0] < 0.05  # a metrics flush may run meanwhile
    assert 0.99 <= per_message["one bare EVALSHA per message (the floor)"][0] <= 1.05
    assert 0.99 <= per_message["through the limiter"][0] <= 1.05  # the connect's own call aside
