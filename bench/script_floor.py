"""decide.lua against its floor: the Redis time of the decision script beside a minimal script that makes
the same decision (bench/reference_decide.lua), side by side in one run.

    .venv/bin/python bench/script_floor.py [--rounds 9] [--calls 2000] [--callgrind-calls 1000] [--write]

The call is the HTTP benchmark's request, as the middleware sends it: the client IP under the per-IP
limit (sliding_window_counter at the bench's 1,000,000/min) and an API key of the seeded enterprise tier
(token_bucket 2,000/min with a burst of 200, exact sliding log 2,000/min: a long log, with a key of its
own, and fixed_window 1,000,000/day), in one EVALSHA with decide.lua's exact KEYS and ARGV
(engine.prepare_call). The reference script is given the same KEYS (under another prefix) and ARGV;
tests/core/test_reference_script.py checks that the two reply the same, byte for byte. Two cases:
"new", a new API key on every call (the IP's key is found, the API key's created); "returning", one IP
and 256 API keys in turn, each called once before the measured calls (each finds its state). Every
call is allowed (checked).

Two measures, each script's against the other's from the same run:
- usec_per_call of EVALSHA (INFO commandstats), on a redis-server of this script's own: batches of
  `--calls` calls (pipelined, 100 at a time), the two scripts alternating, statistics reset before each
  batch; each round gives a ratio, and the row is the median over `--rounds` rounds. Wall time, which
  other work on a loaded machine inflates: the ratio of neighbouring batches is what to read.
- instructions inside EVALSHA (evalShaCommand, inclusive), counted by callgrind on a redis-server run
  under `valgrind --tool=callgrind`: (count of a run of 2N calls - count of a run of N) / N, so start-up,
  the scripts' loading and the returning case's first calls are not counted.

With --write the table replaces its section of docs/benchmarks.md (bench/run.py keeps it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.callgrind import inside, redis_under_callgrind, require  # noqa: E402
from devtools.embedded import start_redis  # noqa: E402
from ratelimit_app.core.engine import PreparedCall, prepare_call  # noqa: E402
from ratelimit_app.core.policies import Policy  # noqa: E402
from ratelimit_app.core.scripts import decide_source  # noqa: E402

REFERENCE_FILE = ROOT / "bench" / "reference_decide.lua"
IP_POLICY = Policy.parse("1000000/m", name="ip", algorithm="sliding_window_counter")  # bench/httpapp: HUGE_RATE
ENTERPRISE = (
    Policy("burst", "token_bucket", limit=2000, period=60, burst=200),
    Policy("minute", "sliding_window", limit=2000, period=60),
    Policy("day", "fixed_window", limit=1_000_000, period=86400),
)
RETURNING_KEYS = 256
SCRIPTS = ("decide.lua", "reference")
CASES = ("new", "returning")
PIPELINE = 100


def reference_source() -> str:
    return REFERENCE_FILE.read_text(encoding="utf-8")


class Caller:
    """Sends the benchmark's call of one case to one script, under a prefix of its own."""

    def __init__(self, client: redis.Redis, script: str, case: str) -> None:
        self.client = client
        self.sha = client.script_load(decide_source() if script == "decide.lua" else reference_source())
        self.prefix = f"{'ours' if script == 'decide.lua' else 'ref'}{case[0]}"
        self.case = case
        self.serial = 0
        if case == "returning":
            self.send(RETURNING_KEYS)

    def _call(self) -> PreparedCall:
        self.serial += 1
        key = f"key:{self.serial % RETURNING_KEYS if self.case == 'returning' else self.serial}"
        return prepare_call(self.prefix, (("ip:10.0.0.1", (IP_POLICY,)), (key, ENTERPRISE)), 1, charge=True)

    def send(self, calls: int) -> None:
        for start in range(0, calls, PIPELINE):
            pipe = self.client.pipeline(transaction=False)
            for _ in range(min(PIPELINE, calls - start)):
                call = self._call()
                pipe.execute_command("EVALSHA", self.sha, len(call.keys), *call.keys, *call.args)
            for reply in pipe.execute():
                if any(reply[24 * i + 16:24 * i + 24] != bytes(8) for i in range(len(reply) // 24)):
                    raise RuntimeError(f"{self.prefix}: a call was refused ({reply.hex()}): every call must be allowed")


def usec_per_call(rounds: int, calls: int) -> dict[tuple[str, str], list[float]]:
    """usec_per_call of each (case, script) in each round, the scripts alternating within a round."""
    server = start_redis()
    try:
        client = redis.Redis(port=server.port, socket_timeout=60)
        callers = {(case, script): Caller(client, script, case) for case in CASES for script in SCRIPTS}
        usec: dict[tuple[str, str], list[float]] = {key: [] for key in callers}
        for _ in range(rounds):
            for key, caller in callers.items():
                client.config_resetstat()
                caller.send(calls)
                usec[key].append(float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]))
        return usec
    finally:
        server.stop()


def instructions(script: str, case: str, calls: int, work: Path) -> int:
    """Instructions inside evalShaCommand over a whole run of `calls` calls (callgrind)."""
    summary = redis_under_callgrind(work, lambda client: Caller(client, script, case).send(calls))
    return inside(summary, "evalShaCommand")


def per_call(script: str, case: str, calls: int, work: Path) -> int:
    """Instructions inside EVALSHA of one call: the 2N run's count less the N run's, over N."""
    return (instructions(script, case, 2 * calls, work) - instructions(script, case, calls, work)) // calls


def _table(usec: dict[tuple[str, str], list[float]], counts: dict[tuple[str, str], int]) -> list[str]:
    lines = ["| case | script | usec_per_call (median) | vs minimal (median of rounds) | each round (usec) "
             "| instructions inside EVALSHA (callgrind) | vs minimal |", "|---|---|---:|---:|---|---:|---:|"]
    for case in CASES:
        for script in SCRIPTS:
            values, floor = usec[(case, script)], usec[(case, "reference")]
            ratio = statistics.median(u / f for u, f in zip(values, floor, strict=True))
            count, floor_count = counts.get((case, script)), counts.get((case, "reference"))
            counted = f"{count:,} | {count / floor_count:.2f}x" if count and floor_count else "- | -"
            label = "decide.lua" if script == "decide.lua" else "minimal (bench/reference_decide.lua)"
            lines.append(f"| {case} | {label} | {statistics.median(values):.2f} | {ratio:.2f}x | "
                         f"{' / '.join(f'{v:.1f}' for v in values)} | {counted} |")
    return lines


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000, help="calls per batch (usec_per_call)")
    parser.add_argument("--callgrind-calls", type=int, default=1000, help="N of the N and 2N runs (0: none)")
    parser.add_argument("--write", action="store_true", help="replace this section of docs/benchmarks.md")
    args = parser.parse_args(argv)
    load_at_start = os.getloadavg()[0]
    counts: dict[tuple[str, str], int] = {}
    if args.callgrind_calls:
        require("valgrind", "callgrind_annotate", "redis-server")
        with tempfile.TemporaryDirectory() as tmp:
            for case in CASES:
                for script in SCRIPTS:
                    counts[(case, script)] = per_call(script, case, args.callgrind_calls, Path(tmp))
                    print(f"callgrind {case} {script}: {counts[(case, script)]:,}", flush=True)
    usec = usec_per_call(args.rounds, args.calls)
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    lines = [f"Redis {version.removeprefix('v=')}; usec_per_call: {args.rounds} rounds of {args.calls} calls per "
             f"case and script; callgrind: {args.callgrind_calls:,} and {2 * args.callgrind_calls:,} calls.", "",
             *_table(usec, counts)]
    print("\n".join(lines))
    if args.write:
        from bench.report_text import write_script_section

        write_script_section("floor", "## 9. The decision script against a minimal script", "bench/script_floor.py", [
            "The benchmark's request (the per-IP limit, sliding_window_counter at 1,000,000/min, and an API key of",
            "the seeded enterprise tier: token_bucket, a long exact sliding log and fixed_window) sent to",
            "decide.lua and to a hand-written script that makes the same decision and nothing else",
            "(`bench/reference_decide.lua`, not shipped: one call shape, its own state format, no entries kept",
            "for other policies; `tests/core/test_reference_script.py` checks that both reply the same).",
            "\"new\": a new API key on every call; \"returning\": 256 API keys in turn, each with its state.",
            "usec_per_call from INFO commandstats, the two scripts in alternating batches (each round's ratio,",
            "median over the rounds); instructions inside EVALSHA counted by callgrind (2N calls less N, over N).",
            "Target: decide.lua within 1.3x the minimal script in both. On a machine shared with other work,",
            "usec_per_call moves with the load (compare the rounds); the callgrind counts do not, and are the",
            "column to read.",
        ], lines, load_at_start, os.getloadavg()[0])


if __name__ == "__main__":
    main(sys.argv[1:])
