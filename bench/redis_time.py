"""Redis time per decision: `usec_per_call` of EVALSHA (INFO commandstats), ours against a bare INCR script.

    python bench/redis_time.py [--rounds 5] [--calls 2000]   # also: Redis CPU per decision, pipelined

One client sends one call per round trip, as the engine does, each for a new identity (every key is
created: the costly case). Each round measures every case once, after CONFIG RESETSTAT, so a case is
compared with the INCR script of its own round; a case's ratio is the median of its rounds' ratios.
Redis counts only the time spent running the command (not reading or writing it), so this is the share
of a Redis core that one decision takes. It is wall time, so other work on the machine inflates it
(more for the longer scripts, which a context switch is likelier to interrupt): the callgrind counts of
`bench/script_instructions.py` are the load-independent view.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devtools.embedded import start_redis
from ratelimit_app.core.engine import prepare_call
from ratelimit_app.core.policies import Policy
from ratelimit_app.core.scripts import decide_source

INCR_SCRIPT = "return redis.call('INCR', KEYS[1])"
TIER = (
    Policy("burst", "token_bucket", limit=20, period=60, burst=10),
    Policy("minute", "sliding_window", limit=20, period=60),
    Policy("day", "fixed_window", limit=1000, period=86400),
)
SINGLE = ("fixed_window", "sliding_window", "sliding_window_counter", "token_bucket", "gcra")
#: case name -> policies (None: the bare INCR script)
CASES: dict[str, tuple[Policy, ...] | None] = {
    "incr": None,
    "tier": TIER,
    **{name: (Policy("limit", name, limit=20, period=60),) for name in SINGLE},
}


@dataclass(frozen=True)
class RedisTime:
    """usec_per_call of each case in each round, and each case's median ratio to the INCR script."""

    rounds: int
    calls: int
    usec: dict[str, list[float]]
    ratio: dict[str, float]  # median over rounds of usec(case) / usec(incr) of the same round


def run_redis_time(admin: redis.Redis, rounds: int, calls: int, prefix: str = "rt") -> RedisTime:
    """Measure every case `rounds` times with `calls` decisions each (new identities)."""
    client = redis.Redis(connection_pool=admin.connection_pool)
    decide = client.script_load(decide_source())
    incr = client.script_load(INCR_SCRIPT)
    usec: dict[str, list[float]] = {name: [] for name in CASES}
    serial = 0
    for _ in range(rounds):
        for name, policies in CASES.items():
            client.config_resetstat()
            for _ in range(calls):
                serial += 1
                if policies is None:
                    client.execute_command("EVALSHA", incr, 1, f"{prefix}:bare:{serial}")
                else:
                    call = prepare_call(prefix, ((f"identity:{serial}", policies),), 1, charge=True)
                    client.execute_command("EVALSHA", decide, len(call.keys), *call.keys, *call.args)
            usec[name].append(float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]))
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(key)
            if len(batch) == 1000:
                client.delete(*batch)
                batch = []
        if batch:
            client.delete(*batch)
    ratio = {name: statistics.median(u / b for u, b in zip(values, usec["incr"], strict=True))
             for name, values in usec.items()}
    return RedisTime(rounds, calls, usec, ratio)


def redis_cpu(client: redis.Redis) -> float:
    """CPU seconds (user + system) the Redis server has used so far (INFO cpu)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def cpu_per_decision(admin: redis.Redis, calls: int, batch: int = 100, prefix: str = "rc") -> dict[str, float]:
    """Redis CPU time (INFO cpu, us) per decision of each case, `calls` new identities sent in pipelines
    of `batch`: what one decision costs a Redis core that is kept busy (reading and answering included)."""
    client = redis.Redis(connection_pool=admin.connection_pool)
    decide = client.script_load(decide_source())
    incr = client.script_load(INCR_SCRIPT)
    result = {}
    for name, policies in CASES.items():
        before = redis_cpu(client)
        for start in range(0, calls, batch):
            pipe = client.pipeline(transaction=False)
            for serial in range(start, min(calls, start + batch)):
                if policies is None:
                    pipe.execute_command("EVALSHA", incr, 1, f"{prefix}:bare:{serial}")
                else:
                    call = prepare_call(prefix, ((f"{name}:{serial}", policies),), 1, charge=True)
                    pipe.execute_command("EVALSHA", decide, len(call.keys), *call.keys, *call.args)
            pipe.execute()
        result[name] = (redis_cpu(client) - before) * 1e6 / calls
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    server = start_redis()
    try:
        admin = redis.Redis(port=server.port, socket_timeout=60)
        timing = run_redis_time(admin, args.rounds, args.calls)
        admin.flushall()  # our own server
        cpu = cpu_per_decision(admin, 20 * args.calls)
        print("| script | usec_per_call (median) | vs INCR | Redis CPU us per decision, pipelined | vs INCR |")
        print("|---|---:|---:|---:|---:|")
        for name, values in timing.usec.items():
            pipelined = f"{cpu[name]:.1f} | {cpu[name] / cpu['incr']:.2f}x" if name in cpu else "- | -"
            print(f"| {name} | {statistics.median(values):.2f} | {timing.ratio[name]:.2f}x | {pipelined} |")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
