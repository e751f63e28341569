"""Redis CPU instructions per decision, counted by callgrind: a measure that machine load cannot skew.

    python bench/script_instructions.py [--calls N]

Runs redis-server under `valgrind --tool=callgrind` (valgrind must be on PATH), sends N and then 2N
EVALSHA calls for new identities through one pipeline, and reports (instructions of the 2N run -
instructions of the N run) / N for each script: the Redis work of one call, start-up excluded; and the
same difference counted inside EVALSHA only (evalShaCommand, inclusive): the part that INFO
commandstats' usec_per_call times, without reading, parsing and answering the command. Needs
redis-server on PATH and the project importable (run it from the repository root with the project's
virtualenv). The numbers in docs/algorithms.md come from this script.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from bench.callgrind import inside, program_total, redis_under_callgrind, require
from ratelimit_app.core.engine import prepare_call
from ratelimit_app.core.policies import Policy
from ratelimit_app.core.scripts import decide_source

INCR_SCRIPT = "return redis.call('INCR', KEYS[1])"
FREE_TIER = (
    Policy("burst", "token_bucket", limit=20, period=60, burst=10),
    Policy("minute", "sliding_window", limit=20, period=60),
    Policy("day", "fixed_window", limit=1000, period=86400),
)
Sender = Callable[[redis.client.Pipeline, int], None]


#: A tier whose limits stay far away during a run: every call of the "existing identities" cases is
#: allowed and charged, as most calls of a busy identity are.
ROOMY_TIER = (
    Policy("burst", "token_bucket", limit=2000, period=60, burst=1000),
    Policy("minute", "sliding_window", limit=2000, period=60),
    Policy("day", "fixed_window", limit=100_000, period=86400),
)
#: The "existing identities" cases' single policy: roomy, and slow to refill, so that its entry is still
#: there at the identity's next call (at 100,000 a minute a token bucket or a GCRA refills a unit every
#: 0.6 ms, and its entry would expire between calls: that would count a new identity's work).
EXISTING_PERIOD = 30 * 86400
#: The "existing identities" cases spread their calls over this many identities (the first call of
#: each is in both runs, so the difference counts only calls that find state and rewrite it).
EXISTING = 100


def _decide(policies: tuple[Policy, ...], identities: int = 0) -> Sender:
    def send(pipe: redis.client.Pipeline, i: int) -> None:
        identity = f"identity:{i % identities if identities else i}"
        call = prepare_call("rl", ((identity, policies),), 1, charge=True)
        pipe.execute_command("EVALSHA", SHAS["decide"], len(call.keys), *call.keys, *call.args)
    return send


def _incr(pipe: redis.client.Pipeline, i: int) -> None:
    pipe.execute_command("EVALSHA", SHAS["incr"], 1, f"bl:identity:{i}")


SHAS: dict[str, str] = {}
#: The Redis calls a decision cannot do without, and nothing else: read the clock, read the identity's
#: key, write it with a TTL (a key of its own per policy: three writes). What is above them is Lua.
SHAPE_SCRIPTS = {
    "shape: TIME + GET + SET PX, the floor of one key": """
local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', '60000')
return 1""",
    "shape: TIME + MGET of 3 keys + 3 SET PX, the floor of a key per policy": """
local t = redis.call('TIME')
local v = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', '60000')
redis.call('SET', KEYS[2], ARGV[1], 'PX', '60000')
redis.call('SET', KEYS[3], ARGV[1], 'PX', '60000')
return 1""",
}


def _shape(label: str) -> Sender:
    def send(pipe: redis.client.Pipeline, i: int) -> None:
        keys = [f"rl:{{identity:{i}}}{p.name}" for p in FREE_TIER]
        pipe.execute_command("EVALSHA", SHAS[label], 3 if "MGET" in label else 1, *keys[:3 if "MGET" in label else 1],
                             "12345678")
    return send


CASES: dict[str, Sender] = {
    "bare EVALSHA of INCR (the benchmark's baseline)": _incr,
    **{label: _shape(label) for label in SHAPE_SCRIPTS},
    "decision: free tier (token_bucket + sliding_window + fixed_window)": _decide(FREE_TIER),
    **{f"decision: {name}": _decide((Policy("p", name, limit=20, period=60),))
       for name in ("fixed_window", "sliding_window", "sliding_window_counter", "token_bucket", "gcra")},
    "existing identities: free tier shape, roomy limits": _decide(ROOMY_TIER, EXISTING),
    **{f"existing identities: {name}": _decide((Policy("p", name, limit=100_000, period=EXISTING_PERIOD),), EXISTING)
       for name in ("fixed_window", "sliding_window", "sliding_window_counter", "token_bucket", "gcra")},
}


def _instructions(send: Sender, calls: int, work: Path) -> tuple[int, int]:
    """Instructions of the whole server run, and of those inside evalShaCommand."""
    def run(client: redis.Redis) -> None:
        SHAS["decide"] = client.script_load(decide_source())
        SHAS["incr"] = client.script_load(INCR_SCRIPT)
        for label, script in SHAPE_SCRIPTS.items():
            SHAS[label] = client.script_load(script)
        for start in range(0, calls, 500):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(calls, start + 500)):
                send(pipe, i)
            pipe.execute()

    summary = redis_under_callgrind(work, run)
    return program_total(summary), inside(summary, "evalShaCommand")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000, help="calls in the shorter run (default 3000)")
    parser.add_argument("--only", nargs="*", default=[],
                        help="measure only the calls whose label contains one of these words (INCR, tier, gcra...)")
    args = parser.parse_args()
    require("valgrind", "callgrind_annotate", "redis-server")
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    print(f"Redis {version.removeprefix('v=')}, instructions per call (callgrind), new identities, "
          f"{args.calls} vs {2 * args.calls} calls")
    print("| call | whole server | inside EVALSHA |")
    with tempfile.TemporaryDirectory() as tmp:
        for label, send in CASES.items():
            if args.only and not any(word in label for word in args.only):
                continue
            short, long = _instructions(send, args.calls, Path(tmp)), _instructions(send, 2 * args.calls, Path(tmp))
            print(f"| {label} | {(long[0] - short[0]) // args.calls:,} | {(long[1] - short[1]) // args.calls:,} |",
                  flush=True)


if __name__ == "__main__":
    main()
