"""Sections 2, 3 and 5 of the report (accuracy under concurrency, Redis memory per identity, Redis time
per decision) and their targets."""

from __future__ import annotations

from typing import Any

from bench.accuracy import ACCURACY_RATE, TIER_ACCURACY_RATE
from bench.memory import MemoryResult
from bench.peers import BY_KEY
from bench.report_text import Target, median, size, spread, table, times
from bench.results import Results

LOG_BYTES_PER_UNIT = 8.5  # the exact sliding log at 2,000/min
O1_BYTES = 100  # O(1) algorithms per identity and policy, key included
TIER_REDIS_TIME = 2.5  # usec_per_call of the 3-policy tier / the bare INCR script
SINGLE_REDIS_TIME = 1.3  # the same for one policy


def store_targets(results: Results) -> list[Target]:
    """Redis memory and Redis time per decision."""
    targets = memory_targets(results.memory)
    timing = results.redis_time
    if timing is not None:
        singles = [n for n in timing.ratio if n not in ("incr", "tier")]
        for name, bound in (("tier", TIER_REDIS_TIME), *((n, SINGLE_REDIS_TIME) for n in singles)):
            label = "3-policy tier" if name == "tier" else name
            targets.append(Target(
                f"Redis time: {label} <= {bound:g}x the bare INCR script",
                f"usec_per_call of EVALSHA, median of {timing.rounds} rounds' ratios, new identities",
                f"{median(timing.usec[name]):.1f} vs {median(timing.usec['incr']):.1f} us = "
                f"{times(timing.ratio[name])}",
                "pass" if timing.ratio[name] <= bound else "miss",
                spread(tuple(timing.usec[name]), tuple(timing.usec["incr"]))))
    return targets


def memory_targets(memory: list[MemoryResult]) -> list[Target]:
    """Section 3's targets: the exact sliding log per unit of limit, the O(1) algorithms per identity."""
    targets = []
    for m in [m for m in memory if m.variant == "ours.sliding_window" and m.rate.limit == 2000]:
        per_unit = m.memory_usage_per_identity / m.filled_to
        targets.append(Target(
            f"exact sliding log <= {LOG_BYTES_PER_UNIT:g} bytes per unit of limit at {m.rate}",
            "MEMORY USAGE per identity filled to its limit / the limit",
            f"{per_unit:.2f} bytes per unit ({size(m.memory_usage_per_identity)} per identity)",
            "pass" if per_unit <= LOG_BYTES_PER_UNIT else "miss"))
    o1 = [m for m in memory if m.variant in {f"ours.{a}" for a in
                                             ("fixed_window", "sliding_window_counter", "token_bucket", "gcra")}]
    if o1:
        worst = max(o1, key=lambda m: m.memory_usage_per_identity)
        targets.append(Target(
            f"O(1) algorithms <= {O1_BYTES} bytes per identity and policy, key included",
            "MEMORY USAGE per identity, every O(1) algorithm of ours at every rate of section 3",
            f"worst: {BY_KEY[worst.variant].label} at {worst.rate}: {size(worst.memory_usage_per_identity)}",
            "pass" if worst.memory_usage_per_identity <= O1_BYTES else "miss"))
    return targets



def redis_time_section(results: Results) -> list[str]:
    timing = results.redis_time
    if timing is None:
        return []
    lines = ["## 5. Redis time per decision", "",
             f"`usec_per_call` of EVALSHA from `INFO commandstats`: {timing.calls:,} decisions per case and "
             f"round, one per round trip from one client, each for a new identity (every key is created), "
             f"{timing.rounds} interleaved rounds, statistics reset before each case. Redis counts only the time "
             "it spends running the command, so this is the share of one Redis core a decision takes; it is "
             "wall time, which other work on the machine inflates (most for the longer scripts), so "
             "`bench/script_instructions.py` (callgrind, in docs/algorithms.md) is the load-independent view. "
             "Policies: the free tier (token_bucket burst 10 at 20/min, sliding_window 20/min, fixed_window "
             "1000/day), or one policy at 20/min.", ""]
    rows = []
    for name, values in timing.usec.items():
        label = "bare EVALSHA of INCR" if name == "incr" else "free tier (3 policies)" if name == "tier" else name
        rows.append([label, f"{median(values):.2f}", times(timing.ratio[name]),
                     " / ".join(f"{v:.1f}" for v in values)])
    lines += table(["script", "usec_per_call (median)", "vs INCR (median of rounds)", "each round"], rows, "lrrl")
    return lines



def accuracy_section(results: Results) -> list[str]:
    s = results.sizes
    lines = ["## 2. Accuracy under concurrency", "",
             f"{s.accuracy_clients} clients ({s.accuracy_clients // s.processes} threads in each of {s.processes} "
             f"processes) send {s.accuracy_hits} requests each, as fast as they can from a common start, for one "
             f"identity with a limit of {ACCURACY_RATE.limit} per hour ({s.accuracy_clients * s.accuracy_hits} "
             f"attempts); {s.accuracy_runs} run(s) each. Nothing refills noticeably within a run and no run "
             "starts within 5 s of an hour boundary, so an exact limiter admits exactly the limit. Our tier runs "
             f"as a free-tier-shaped tier at {TIER_ACCURACY_RATE} (burst {TIER_ACCURACY_RATE.limit // 2}, the "
             "tightest policy).", ""]
    rows = []
    for result in results.accuracy:
        variant = BY_KEY[result.variant]
        admitted = ", ".join(str(a) for a in result.admitted)
        over = result.over_admission
        under = result.limit - min(result.admitted)
        verdict = "exact" if over == 0 and under == 0 else (f"over by {over}" if over else f"under by {under}")
        name = f"**{variant.label}**" if variant.family == "ours" else variant.label
        rows.append([name, "yes" if variant.exact else "no", str(result.limit), admitted, verdict])
    lines += table(["limiter", "exact algorithm?", "limit", "admitted per run", "result"], rows, "lllll")
    notes = _accuracy_notes(results.accuracy)
    if notes:
        lines += ["Why the peers that miss do:", "", *notes, ""]
    return lines


def _accuracy_notes(accuracy: list[Any]) -> list[str]:
    notes = []
    if any(r.variant == "drf" and r.over_admission for r in accuracy):
        notes.append("- DRF's SimpleRateThrottle reads the history list (GET), decides in Python and writes it back "
                     "(SET): concurrent requests overwrite each other's entries, so the list grows slower than the "
                     "traffic (DRF issue #5181).")
    pyrate = [BY_KEY[r.variant].algorithm for r in accuracy
              if r.variant.startswith("pyrate.") and min(r.admitted) < r.limit]
    if pyrate:
        notes.append(f"- pyrate-limiter ({', '.join(pyrate)}): `Limiter.try_acquire(name, blocking=False)` answers "
                     "False whenever another thread of the same process holds the limiter's lock, which it holds "
                     "across the Redis round trip, so concurrent clients are refused while the limit still has room "
                     "(under-admission). With `blocking=True` it would wait instead, which a request handler cannot.")
    other = [r for r in accuracy if BY_KEY[r.variant].family == "peer" and r.variant != "drf"
             and not r.variant.startswith("pyrate.") and (r.over_admission or min(r.admitted) < r.limit)]
    notes += [f"- {BY_KEY[r.variant].label}: admitted {', '.join(map(str, r.admitted))} of {r.limit}." for r in other]
    return notes


#: The marker name of section 3: a full run writes it in place, `bench/run.py --memory-only` replaces it.
MEMORY_SECTION = "memory"


def memory_section(memory: list[MemoryResult], provenance: str = "") -> list[str]:
    """Section 3: Redis memory per active identity, for every limiter at each rate of bench/memory.py."""
    lines = ["## 3. Redis memory per active identity", ""]
    if provenance:
        lines += [f"Measured on its own by {provenance}; the rest of this document comes from the run named at the "
                  "top.", ""]
    lines += ["For each limiter and rate, the Redis is flushed and N identities are filled to their limit (with the "
             "library's cost/weight argument where it has one, else hit by hit). *MEMORY USAGE* is the sum of "
             "`MEMORY USAGE key SAMPLES 0` over all keys, *used_memory* the growth of `INFO memory` (allocator "
             "overheads included), both per live identity, whatever number of keys it holds (*keys*, counted on "
             "one identity filled alone first: a long exact sliding log of ours keeps its units in a key of its "
             "own next to its identity's key). N is 10,000 unless filling would exceed the run's work "
             "budget (a hit per unit without a cost argument; a stored entry per unit for log-based state): then it "
             "is smaller, and used_memory is not reported below 100 identities (too small to measure). *Full* "
             "means the last identity each worker filled was denied right after its fill.", ""]
    rows = []
    for result in memory:
        variant = BY_KEY[result.variant]
        name = f"**{variant.label}**" if variant.family == "ours" else variant.label
        live = f"{result.identities:,}" + ("" if result.live_identities == result.identities
                                          else f" ({result.live_identities:,} live)")
        used = size(result.used_memory_per_identity) if result.live_identities >= 100 else "—"
        rows.append([name, str(result.rate), live, f"{result.filled_to:,}", str(result.keys_per_identity),
                     size(result.memory_usage_per_identity), used, "yes" if result.verified_full else "no"])
    lines += table(["limiter", "rate", "identities", "filled to", "keys", "MEMORY USAGE bytes", "used_memory bytes",
                     "full"], rows, "llrrrrrl")
    return lines


