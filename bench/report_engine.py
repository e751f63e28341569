"""Section 1 of the report (decisions per second, the paired tier, the engine's transports) and the
engine's targets."""

from __future__ import annotations

import math

from bench.engine_bench import EngineResult, Run
from bench.peers import BY_KEY, VARIANTS
from bench.report_text import ENGINE_TARGET, Target, num, spread, table, times, usec
from bench.results import Results
from bench.transports import transport_section, transport_targets

IMAGE = "img/benchmarks.png"
DENY_TARGET = 10.0


def engine_of(results: Results, variant: str, mode: str) -> EngineResult | None:
    return next((r for r in results.engine if r.variant == variant and r.mode == mode), None)


def run_of(results: Results, variant: str, mode: str, processes: int) -> Run | None:
    found = engine_of(results, variant, mode)
    return found.run(processes) if found else None


def rate_of(run: Run | None) -> float:
    return run.per_second if run else float("nan")


def samples_of(results: Results, variant: str, mode: str, processes: int) -> tuple[float, ...]:
    run = run_of(results, variant, mode, processes)
    return run.samples if run else ()


def engine_targets(results: Results) -> list[Target]:
    """The engine's targets: the tier against one bare EVALSHA, against the peers, exactness, the deny cache."""
    n = results.sizes.processes
    targets = []
    for paired in results.paired:
        if {"baseline", "ours.tier"} <= set(paired.per_second):
            ratio = paired.ratio("ours.tier", "baseline")
            raw = (f"; vs the raw-connection EVALSHA {times(paired.ratio('ours.tier', 'baseline.raw'))}"
                   if "baseline.raw" in paired.per_second else "")
            by_cpu = paired.cpu["baseline"] / paired.cpu["ours.tier"]
            targets.append(Target(
                f"3-policy tier >= {ENGINE_TARGET}x one bare EVALSHA, {paired.processes} process(es)",
                f"median of {paired.rounds} alternating rounds, allowed traffic, same client",
                f"{num(paired.per_second['ours.tier'])} vs {num(paired.per_second['baseline'])} decisions/s "
                f"= {times(ratio)}{raw}; by CPU per decision (client + Redis) {times(by_cpu)}",
                "pass" if ratio >= ENGINE_TARGET else "miss",
                spread(paired.samples["ours.tier"], paired.samples["baseline"])))
    if not any({"baseline", "ours.tier"} <= set(p.per_second) for p in results.paired):
        targets.append(Target(f"3-policy tier >= {ENGINE_TARGET}x one bare EVALSHA", "paired rounds",
                              results.unavailable.get("ours.tier", "the tier or the baseline did not run"),
                              "not measured"))
    targets += transport_targets(results.transports)
    peers = [v.key for v in VARIANTS if v.family == "peer" and engine_of(results, v.key, "allowed")]
    for processes in (1, n):
        tier = rate_of(run_of(results, "ours.tier", "allowed", processes))
        if not peers or math.isnan(tier):
            continue
        best = max(peers, key=lambda key: rate_of(run_of(results, key, "allowed", processes)))
        best_rate = rate_of(run_of(results, best, "allowed", processes))
        targets.append(Target(
            f"tier (3 policies) faster than every peer's single policy, {processes} process(es)",
            "allowed traffic, decisions/s of the main table",
            f"tier {num(tier)}; fastest peer {BY_KEY[best].label} {num(best_rate)} ({times(tier / best_rate)})",
            "pass" if tier > best_rate else "miss",
            spread(*(samples_of(results, key, "allowed", processes) for key in ("ours.tier", best)))))
    exact = [a for a in results.accuracy if BY_KEY[a.variant].family == "ours" and BY_KEY[a.variant].exact]
    if exact:
        worst = max(exact, key=lambda a: a.over_admission)
        targets.append(Target(
            "zero over-admission for every exact algorithm of ours, every run",
            f"{results.sizes.accuracy_clients} concurrent clients, {len(exact)} limiters x "
            f"{results.sizes.accuracy_runs} runs",
            f"worst: {BY_KEY[worst.variant].label} admitted {max(worst.admitted)} of limit {worst.limit}",
            "pass" if worst.over_admission == 0 else "miss"))
    service = engine_of(results, "ours.service.tier", "denied")
    if service is not None:
        for processes in (1, n):
            ours, base = rate_of(service.run(processes)), rate_of(run_of(results, "baseline", "denied", processes))
            cache_used = service.round_trips < 0.5
            measured = (f"{num(ours)} vs {num(base)} decisions/s = {times(ours / base)}; "
                        f"{service.round_trips:.2f} Redis round trips per denied decision")
            status = ("pass" if ours / base >= DENY_TARGET else "miss") if cache_used else "not yet available"
            targets.append(Target(
                f"denied hot identity >= {DENY_TARGET:g}x faster than the baseline, {processes} process(es)",
                "get_limiter().hit() on an identity over its limit vs one bare EVALSHA (local deny cache)",
                measured, status,
                spread(*(samples_of(results, key, "denied", processes) for key in ("ours.service.tier", "baseline")))))
    return targets


def engine_section(results: Results) -> list[str]:
    n = results.sizes.processes
    lines = [
        "## 1. Decisions per second",
        "",
        f"Each limiter decides in a tight loop for {results.sizes.engine_duration:g} s, in 1 process and in {n} "
        "processes started together (long-lived worker processes, one redis-py client each, hiredis parser), "
        f"in {results.sizes.engine_rounds} interleaved round(s) over all limiters; each cell is the median round. "
        "*Allowed*: every decision is for a new identity (distinct clients), so every limiter admits it. "
        "*Denied*: one hot identity, first filled to its limit, asked again and again. Latency is the time of "
        "one call in the 1-process run. *Round trips* are the commands one decision writes to Redis (a "
        "pipeline counts once), counted on a separate probe; *client / Redis CPU* is the CPU time per decision "
        "of the deciding process (`time.process_time`) and of the Redis server (`INFO cpu`) in the 1-process "
        "run, far less sensitive than decisions/s to other work on the machine. Limits: 20/min for "
        "single-policy limiters; the tier "
        "is the seeded free tier (token_bucket burst 10 refilling 20/min, sliding_window 20/min, "
        "fixed_window 1000/day).",
        "",
    ]
    header = ["limiter", "algorithm", "round trips allowed / denied", "client / Redis CPU µs allowed 1p",
              "allowed 1p /s", f"allowed {n}p /s", "denied 1p /s", f"denied {n}p /s",
              "p50 / p99 µs allowed 1p", "p50 / p99 µs denied 1p"]
    rows = []
    for variant in VARIANTS:
        allowed, denied = engine_of(results, variant.key, "allowed"), engine_of(results, variant.key, "denied")
        if allowed is None or denied is None:
            continue
        a1, an, d1, dn = allowed.run(1), allowed.run(n), denied.run(1), denied.run(n)
        name = f"**{variant.label}**" if variant.family == "ours" else variant.label
        rows.append([name, variant.algorithm, f"{allowed.round_trips:.2f} / {denied.round_trips:.2f}",
                     f"{usec(a1.client_cpu)} / {usec(a1.server_cpu)}" if a1 else "n/a",
                     num(rate_of(a1)), num(rate_of(an)), num(rate_of(d1)), num(rate_of(dn)),
                     f"{usec(a1.p50)} / {usec(a1.p99)}" if a1 else "n/a",
                     f"{usec(d1.p50)} / {usec(d1.p99)}" if d1 else "n/a"])
    lines += table(header, rows, "llrrrrrrrr")
    leaks = [f"{BY_KEY[r.variant].label} ({r.mode}, {run.processes}p: {run.admitted} of {run.decisions} admitted)"
             for r in results.engine for run in r.runs
             if (r.mode == "allowed" and run.admitted != run.decisions)
             or (r.mode == "denied" and run.admitted > max(2, run.decisions // 100))]
    if leaks:
        lines += ["Runs whose traffic was not what its mode says (allowed traffic denied, or a hot identity "
                  "admitted more than the refill explains): " + "; ".join(leaks) + ".", ""]
    lines += [f"![decisions per second by limiter]({IMAGE})", ""]
    lines += ["### The tier against one bare EVALSHA, paired", "",
              "The engine target compares the 3-policy tier with a bare one-key EVALSHA of a trivial INCR script "
              "from the same client in the same run. To keep machine noise out of the ratio, the baselines and "
              "the tier run in alternating rounds (allowed traffic) and the medians are compared. *Baseline* is "
              "`client.evalsha()`, redis-py's public call (what the target names); *raw* sends the same EVALSHA "
              "with `send_command` / `read_response` on a pooled connection, skipping redis-py's command "
              "wrapper, so it is the stricter floor. (The engine goes further: each thread keeps its own "
              "connection and sends a command packed once per policy set.)", ""]
    rows = []
    for paired in results.paired:
        ps = paired.per_second
        rows.append([str(paired.processes), str(paired.rounds), num(ps.get("baseline", math.nan)),
                     num(ps.get("baseline.raw", math.nan)), num(ps.get("ours.tier", math.nan)),
                     times(paired.ratio("ours.tier", "baseline")) if {"baseline", "ours.tier"} <= set(ps) else "n/a",
                     times(paired.ratio("ours.tier", "baseline.raw")) if {"baseline.raw", "ours.tier"} <= set(ps)
                     else "n/a",
                     f"{usec(paired.cpu.get('baseline', math.nan))} / {usec(paired.cpu.get('ours.tier', math.nan))}",
                     " / ".join(num(v) for v in paired.samples.get("ours.tier", ()))])
    lines += table(["processes", "rounds", "baseline /s", "raw baseline /s", "tier /s", "tier / baseline",
                     "tier / raw", "CPU µs per decision, baseline / tier", "tier, each round /s"], rows)
    if results.transports is not None:
        lines += transport_section(results.transports)
    return lines

