"""How long and how big each measurement is, for the full run, --quick and --smoke."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    """Every count and duration of one benchmark run (seconds unless named otherwise)."""

    name: str
    processes: int  # worker processes of the multi-process runs
    engine_duration: float  # one timed run of one variant
    engine_rounds: int  # interleaved rounds of the whole engine table; each cell is the median round
    probe_decisions: int  # decisions counted for round trips per decision
    paired_rounds: int  # alternating rounds of baseline vs tier for the headline ratio
    paired_duration: float
    accuracy_clients: int
    accuracy_hits: int  # per client
    accuracy_runs: int
    memory_identities: int
    memory_hit_budget: int  # most hits one memory row may spend filling (limiters without a cost argument)
    memory_unit_budget: int  # most log entries one memory row may write
    http_duration: float
    http_warmup: float
    http_rounds: int
    http_connections: int
    http_workers: int
    http_threads: int  # threads per gunicorn worker; 0: sync workers
    redis_time_rounds: int = 5  # interleaved rounds of the Redis time per decision (usec_per_call)
    redis_time_calls: int = 2_000  # decisions per case and round


FULL = Sizes("full", processes=4, engine_duration=0.5, engine_rounds=3, probe_decisions=50, paired_rounds=9,
             paired_duration=0.7, accuracy_clients=32, accuracy_hits=10, accuracy_runs=3,
             memory_identities=10_000, memory_hit_budget=20_000, memory_unit_budget=1_000_000,
             http_duration=2.0, http_warmup=1.0, http_rounds=11, http_connections=8, http_workers=2, http_threads=0)
QUICK = Sizes("quick", processes=4, engine_duration=0.4, engine_rounds=1, probe_decisions=20, paired_rounds=3,
              paired_duration=0.5, accuracy_clients=32, accuracy_hits=10, accuracy_runs=3,
              memory_identities=2_000, memory_hit_budget=5_000, memory_unit_budget=200_000,
              http_duration=2.0, http_warmup=1.0, http_rounds=3, http_connections=8, http_workers=2, http_threads=0,
              redis_time_rounds=3, redis_time_calls=1_000)
SMOKE = Sizes("smoke", processes=2, engine_duration=0.05, engine_rounds=1, probe_decisions=3, paired_rounds=1,
              paired_duration=0.05, accuracy_clients=8, accuracy_hits=20, accuracy_runs=1,
              memory_identities=20, memory_hit_budget=200, memory_unit_budget=2_000,
              http_duration=0.3, http_warmup=0.0, http_rounds=1, http_connections=2, http_workers=1, http_threads=0,
              redis_time_rounds=1, redis_time_calls=20)

BY_NAME = {sizes.name: sizes for sizes in (FULL, QUICK, SMOKE)}
