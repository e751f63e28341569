"""The fault-injection report in one command: `.venv/bin/python -m bench.faults.run` from the repository root.

Starts its own stores (Redis 7 and Valkey 9 standalone, a Redis Sentinel group, a 3-master Redis
Cluster), a ledger Redis and the demo under gunicorn (2 workers) and uvicorn, all on loopback ports,
and runs every fault of bench/faults/faults.py in each fail mode (open, closed, local); then writes
docs/reliability.md (about 15 minutes). `--short` is CI's run: Redis alone, four faults, the closed
and local fail modes (about two minutes), written to --output only when given. Either exits 1 when a
row breaks a rule that holds in every fail mode (a 5xx, a slot held past its lease, a metric count
lost or duplicated while the store and the app processes kept their memory, a key without a TTL).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from devtools.embedded import start_redis

from .apps import make_keys
from .faults import faults_for
from .measure import RowResult
from .report import current_commit, violations, write_report
from .session import run_session

ROOT = Path(__file__).resolve().parents[2]
MODES = ("open", "closed", "local")
STORES = ("redis", "valkey", "sentinel", "cluster")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.faults.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="CI's run: Redis, four faults, closed and local")
    parser.add_argument("--output", type=Path, help="the report (default: docs/reliability.md; none with --short)")
    parser.add_argument("--stores", default=None, help=f"comma-separated, of {', '.join(STORES)}")
    parser.add_argument("--modes", default=None, help="comma-separated fail modes (default: all three; "
                        "closed,local with --short)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    parser.add_argument("--render", type=Path, help="write the report from the JSON of an earlier run (no run)")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.render:
        return render(args.render, args.output or ROOT / "docs" / "reliability.md")
    stores = (args.stores or ("redis" if args.short else ",".join(STORES))).split(",")
    output = args.output or (None if args.short else ROOT / "docs" / "reliability.md")
    started, commit = time.time(), current_commit()
    ledger = start_redis()
    rows: list[RowResult] = []
    facts: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="ratelimit-faults-") as directory:
        work = Path(directory)
        most = max(len(faults_for(store, args.short)) for store in stores)
        keys = make_keys(work, ledger.url, most)
        for store in stores:
            for mode in (args.modes or ("closed,local" if args.short else ",".join(MODES))).split(","):
                session_rows, session_facts = run_session(store, mode, faults_for(store, args.short), keys,
                                                          ledger.url, work)
                rows += session_rows
                facts[f"{store}/{mode}"] = session_facts
    ledger.stop()
    elapsed = time.time() - started
    if args.json:
        args.json.write_text(json.dumps({"rows": [asdict(row) for row in rows], "facts": facts, "elapsed": elapsed,
                                         "short": args.short, "machine": platform.platform(), "commit": commit},
                                        indent=1))
    if output is not None:
        write_report(output, rows, facts, elapsed, short=args.short, machine=platform.platform(), commit=commit)
    broken = violations(rows, facts)
    for line in broken:
        print(f"faults: FAILED: {line}", flush=True)
    print(f"faults: {len(rows)} rows in {elapsed:.0f} s; {len(broken)} violations", flush=True)
    return 1 if broken else 0


def render(source: Path, output: Path) -> int:
    run = json.loads(source.read_text())
    rows = [RowResult(**row) for row in run["rows"]]
    write_report(output, rows, run["facts"], run["elapsed"], short=run["short"], machine=run["machine"],
                 commit=run["commit"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
