"""docs/reliability.md from the rows of a run, and the rules every row must keep (CI's verdict).

The page's prose lives in reliability_text.py; this module makes the tables and the verdicts.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

from .faults import FAULTS
from .measure import RowResult
from .reliability_text import closing, explanations, findings, heading

WHAT = {fault.name: fault.what for fault in FAULTS}
STORE_TITLES = {"redis": "Redis, one server", "valkey": "Valkey, one server", "sentinel": "Redis Sentinel",
                "cluster": "Redis Cluster"}


def row_problems(row: RowResult) -> list[str]:
    """What `row` breaks of the rules that hold in every fail mode (empty: none)."""
    problems = []
    if row.errors_5xx:
        problems.append(f"{row.errors_5xx} 5xx")
    if row.slots_leaked:
        problems.append(f"{row.slots_leaked} slots held past their lease")
    for name, delta in row.metrics.items():
        if delta > 0:
            problems.append(f"metrics: {delta} {name} counted more than once (duplicated)")
        elif delta < 0 and not row.metrics_lost_with:
            problems.append(f"metrics: {-delta} {name} lost")
    return problems


def violations(rows: list[RowResult], facts: dict[str, dict[str, object]]) -> list[str]:
    found = [f"{row.store} {row.mode} {row.fault}: {problem}" for row in rows for problem in row_problems(row)]
    found += [f"{session}: {ttl} keys without a TTL" for session, fact in facts.items()
              if (ttl := int(str(fact["keys_without_ttl"])))]
    return found


def _verdict(row: RowResult) -> str:
    problems = row_problems(row)
    if problems:
        return "**FAILS: " + "; ".join(problems) + "**"
    notes = []
    lost = -sum(delta for delta in row.metrics.values() if delta < 0)
    if lost:
        notes.append(f"{lost} counts lost with the {'store' if row.metrics_lost_with == 'store' else 'killed workers'}")
    return "ok" + (f" ({'; '.join(notes)})" if notes else "")


def _latency(row: RowResult) -> str:
    servers = ", ".join(f"{row.p99_by_server[name]:.0f}" for name in ("gunicorn", "uvicorn")
                        if name in row.p99_by_server)
    return f"{row.p50_ms:.0f} / {row.p99_ms:.0f}" + (f" ({servers})" if servers else "")


def _cells(row: RowResult) -> list[str]:
    exact = "not within the row" if row.exact_after is None else f"{row.exact_after:.0f} s"
    metrics = " / ".join(f"{delta:+d}" for delta in (row.metrics.get("allowed", 0), row.metrics.get("blocked", 0)))
    return [row.mode, f"{row.lasted:.1f}", str(row.requests), str(row.served), f"{row.over_max} / {row.over_total}",
            str(row.refused_429), str(row.refused_503), str(row.errors_5xx), str(row.no_answer),
            _latency(row), exact,
            f"{row.slots_held_after_fault if row.fault == 'worker-killed' else 'n/a'} / {row.slots_held_at_end} → "
            f"{row.slots_leaked}",
            metrics, _verdict(row)]


HEADER = ("| fault | mode | lasted s | requests | served | over limit: most in a window / all | 429 | 503 | "
          "other 5xx | no answer | p50 / p99 ms (p99: gunicorn, uvicorn) | exact again | "
          "slots held: by the killed requests / at end → after lease | metrics minus clients: allowed / blocked | "
          "verdict |\n|" + "---|" * 15)


def tables(rows: list[RowResult], facts: dict[str, dict[str, object]]) -> Iterable[str]:
    for store in dict.fromkeys(row.store for row in rows):
        sessions = {key: fact for key, fact in facts.items() if key.startswith(f"{store}/")}
        version = next(iter(sessions.values()))["version"]
        ttl = sum(int(str(fact["keys_without_ttl"])) for fact in sessions.values())
        yield f"\n### {STORE_TITLES.get(store, store)}: {version}\n"
        yield f"Keys without a TTL after its sessions: **{ttl}**.\n"
        yield HEADER
        for fault in dict.fromkeys(row.fault for row in rows if row.store == store):
            for row in (r for r in rows if r.store == store and r.fault == fault):
                what = WHAT[fault] + (f" ({row.note})" if row.note else "")
                yield f"| {what} | " + " | ".join(_cells(row)) + " |"


def current_commit() -> str:
    """The checkout's commit (with "+changes" when the working tree differs from it)."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return (done.stdout.strip() or "unknown") + (" +changes" if dirty.stdout.strip() else "")


def write_report(path: Path, rows: list[RowResult], facts: dict[str, dict[str, object]], elapsed: float, *,
                 short: bool, machine: str, commit: str) -> None:
    parts = [heading(rows, facts, elapsed, short=short, machine=machine, commit=commit), *explanations(),
             "\n## Results\n", *tables(rows, facts), findings(rows, facts), closing(rows)]
    path.write_text("\n".join(parts).rstrip() + "\n", encoding="utf-8")
