"""Turns one run's results into docs/benchmarks.md and docs/img/benchmarks.png.

The project's speed targets (engine, HTTP, ASGI, memory, Redis time) are judged here from the
measured numbers, with the rule for each written next to it; a miss is reported as a miss.
"""

from __future__ import annotations

import datetime
import math
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.accuracy import ACCURACY_RATE, TIER_ACCURACY_RATE
from bench.asgi_profile import LOOP, PARTS, AsgiProfile
from bench.engine_bench import TRANSPORTS, EngineResult, Run, Transports
from bench.memory import MemoryResult
from bench.peers import BY_KEY, VARIANTS
from bench.runner import AsgiSection, Results

IMAGE = Path("img") / "benchmarks.png"
ENGINE_TARGET = 0.9
DENY_TARGET = 10.0
HTTP_TARGET = 0.9
LOG_BYTES_PER_UNIT = 8.5  # the exact sliding log at 2,000/min
O1_BYTES = 100  # O(1) algorithms per identity and policy, key included
TIER_REDIS_TIME = 2.5  # usec_per_call of the 3-policy tier / the bare INCR script
SINGLE_REDIS_TIME = 1.3  # the same for one policy


@dataclass(frozen=True)
class Target:
    """One promise, what was measured, and whether it held ("pass", "miss", or why it was not judged)."""

    promise: str
    rule: str
    measured: str
    status: str
    spread: float = 1.0  # largest max/min ratio among the rounds the verdict rests on


NOISY_SPREAD = 1.5


def _spread(*samples: tuple[float, ...]) -> float:
    spreads = [max(s) / min(s) for s in samples if s and min(s) > 0]
    return max(spreads, default=1.0)


# -- formatting ------------------------------------------------------------------------------------
def _n(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:,.0f}"


def _us(seconds: float) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1e6:,.0f}"


def _signed_us(seconds: float) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1e6:+,.0f} µs"


def _ms(seconds: float) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.1f}"


def _x(ratio: float) -> str:
    return "n/a" if ratio is None or math.isnan(ratio) else f"{ratio:.2f}x"


def _bytes(value: float) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:,.0f}" if value < 10_000 else f"{value / 1024:,.1f} KiB"


def _table(header: list[str], rows: list[list[str]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    marks = [":---" if a == "l" else "---:" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |",
            *("| " + " | ".join(row) + " |" for row in rows), ""]


# -- lookups ---------------------------------------------------------------------------------------
def _engine(results: Results, variant: str, mode: str) -> EngineResult | None:
    return next((r for r in results.engine if r.variant == variant and r.mode == mode), None)


def _run(results: Results, variant: str, mode: str, processes: int) -> Run | None:
    found = _engine(results, variant, mode)
    return found.run(processes) if found else None


def _rate(run: Run | None) -> float:
    return run.per_second if run else float("nan")


def _samples(results: Results, variant: str, mode: str, processes: int) -> tuple[float, ...]:
    run = _run(results, variant, mode, processes)
    return run.samples if run else ()


# -- targets ---------------------------------------------------------------------------------------
def evaluate(results: Results) -> list[Target]:
    """Judge every target from the measured numbers (see each Target's rule)."""
    n = results.sizes.processes
    targets = []
    for paired in results.paired:
        if {"baseline", "ours.tier"} <= set(paired.per_second):
            ratio = paired.ratio("ours.tier", "baseline")
            raw = (f"; vs the raw-connection EVALSHA {_x(paired.ratio('ours.tier', 'baseline.raw'))}"
                   if "baseline.raw" in paired.per_second else "")
            by_cpu = paired.cpu["baseline"] / paired.cpu["ours.tier"]
            targets.append(Target(
                f"3-policy tier >= {ENGINE_TARGET}x one bare EVALSHA, {paired.processes} process(es)",
                f"median of {paired.rounds} alternating rounds, allowed traffic, same client",
                f"{_n(paired.per_second['ours.tier'])} vs {_n(paired.per_second['baseline'])} decisions/s "
                f"= {_x(ratio)}{raw}; by CPU per decision (client + Redis) {_x(by_cpu)}",
                "pass" if ratio >= ENGINE_TARGET else "miss",
                _spread(paired.samples["ours.tier"], paired.samples["baseline"])))
    if not any({"baseline", "ours.tier"} <= set(p.per_second) for p in results.paired):
        targets.append(Target(f"3-policy tier >= {ENGINE_TARGET}x one bare EVALSHA", "paired rounds",
                              results.unavailable.get("ours.tier", "the tier or the baseline did not run"),
                              "not measured"))
    targets += transport_targets(results.transports)
    peers = [v.key for v in VARIANTS if v.family == "peer" and _engine(results, v.key, "allowed")]
    for processes in (1, n):
        tier = _rate(_run(results, "ours.tier", "allowed", processes))
        if not peers or math.isnan(tier):
            continue
        best = max(peers, key=lambda key: _rate(_run(results, key, "allowed", processes)))
        best_rate = _rate(_run(results, best, "allowed", processes))
        targets.append(Target(
            f"tier (3 policies) faster than every peer's single policy, {processes} process(es)",
            "allowed traffic, decisions/s of the main table",
            f"tier {_n(tier)}; fastest peer {BY_KEY[best].label} {_n(best_rate)} ({_x(tier / best_rate)})",
            "pass" if tier > best_rate else "miss",
            _spread(*(_samples(results, key, "allowed", processes) for key in ("ours.tier", best)))))
    exact = [a for a in results.accuracy if BY_KEY[a.variant].family == "ours" and BY_KEY[a.variant].exact]
    if exact:
        worst = max(exact, key=lambda a: a.over_admission)
        targets.append(Target(
            "zero over-admission for every exact algorithm of ours, every run",
            f"{results.sizes.accuracy_clients} concurrent clients, {len(exact)} limiters x "
            f"{results.sizes.accuracy_runs} runs",
            f"worst: {BY_KEY[worst.variant].label} admitted {max(worst.admitted)} of limit {worst.limit}",
            "pass" if worst.over_admission == 0 else "miss"))
    service = _engine(results, "ours.service.tier", "denied")
    if service is not None:
        for processes in (1, n):
            ours, base = _rate(service.run(processes)), _rate(_run(results, "baseline", "denied", processes))
            cache_used = service.round_trips < 0.5
            measured = (f"{_n(ours)} vs {_n(base)} decisions/s = {_x(ours / base)}; "
                        f"{service.round_trips:.2f} Redis round trips per denied decision")
            status = ("pass" if ours / base >= DENY_TARGET else "miss") if cache_used else "not yet available"
            targets.append(Target(
                f"denied hot identity >= {DENY_TARGET:g}x faster than the baseline, {processes} process(es)",
                "get_limiter().hit() on an identity over its limit vs one bare EVALSHA (local deny cache)",
                measured, status,
                _spread(*(_samples(results, key, "denied", processes) for key in ("ours.service.tier", "baseline")))))
    targets += _issue14_targets(results)
    http = results.http
    if http is not None:
        by = {r.variant: r for r in http.results}
        if "ours" not in by or "evalsha" not in by:
            why = "; ".join(f"{v}: {results.http_unavailable.get(v, 'did not run')}" for v in ("ours", "evalsha")
                            if v not in by)
            targets.append(Target(f"HTTP: our middleware >= {HTTP_TARGET}x the one-EVALSHA floor, and faster "
                                  "than every peer variant", "requests/s under gunicorn", why, "not measured"))
        else:
            ratio = by["ours"].per_second / by["evalsha"].per_second
            cpu_ratio = ((by["evalsha"].app_cpu + by["evalsha"].server_cpu)
                         / (by["ours"].app_cpu + by["ours"].server_cpu))
            targets.append(Target(
                f"HTTP: our middleware >= {HTTP_TARGET}x the one-EVALSHA floor",
                "requests/s under gunicorn, same view, same load (median rounds)",
                f"{_n(by['ours'].per_second)} vs {_n(by['evalsha'].per_second)} req/s = {_x(ratio)}; by CPU per "
                f"request (gunicorn + Redis) {_x(cpu_ratio)}",
                "pass" if ratio >= HTTP_TARGET else "miss",
                _spread(http.rounds.get("ours", ()), http.rounds.get("evalsha", ()))))
            peer_variants = [v for v in ("drf", "django-ratelimit", "smart") if v in by]
            if peer_variants:
                best_http = max(peer_variants, key=lambda v: by[v].per_second)
                targets.append(Target(
                    "HTTP: our middleware faster than every peer variant",
                    "requests/s under gunicorn",
                    f"ours {_n(by['ours'].per_second)}; fastest peer {best_http} {_n(by[best_http].per_second)} "
                    f"req/s ({_x(by['ours'].per_second / by[best_http].per_second)})",
                    "pass" if by["ours"].per_second > by[best_http].per_second else "miss",
                    _spread(http.rounds.get("ours", ()), http.rounds.get(best_http, ()))))
    if results.asgi is not None:
        targets += asgi_http_targets(results.asgi)
    return targets


def asgi_http_targets(section: AsgiSection) -> list[Target]:
    """Issue 11's HTTP targets under uvicorn: our async middleware >= 0.9x the async floor, and ahead of
    our sync middleware run in a thread."""
    floor_promise = f"ASGI: our async middleware >= {HTTP_TARGET}x the async one-EVALSHA floor"
    sync_promise = "ASGI: our async middleware ahead of our sync middleware under ASGI"
    http = section.http
    by = {r.variant: r for r in http.results} if http is not None else {}
    if not {"async-ours", "async-evalsha", "sync-ours"} <= set(by):
        why = section.note or "not every ASGI variant ran"
        return [Target(floor_promise, "requests/s under uvicorn", why, "not measured"),
                Target(sync_promise, "requests/s under uvicorn", why, "not measured")]
    ours, floor, sync = by["async-ours"], by["async-evalsha"], by["sync-ours"]
    ratio = ours.per_second / floor.per_second
    return [
        Target(floor_promise, "requests/s under uvicorn, same async view, same load (median rounds)",
               f"{_n(ours.per_second)} vs {_n(floor.per_second)} req/s = {_x(ratio)} (median of the rounds' "
               f"ratios {_x(_median_ratio(http.rounds['async-ours'], http.rounds['async-evalsha']))}); by CPU per "
               f"request (uvicorn + Redis) {_x((floor.app_cpu + floor.server_cpu) / (ours.app_cpu + ours.server_cpu))}",
               "pass" if ratio >= HTTP_TARGET else "miss",
               _spread(http.rounds["async-ours"], http.rounds["async-evalsha"])),
        Target(sync_promise, "requests/s under uvicorn, same async view, same load (median rounds)",
               f"async {_n(ours.per_second)} vs sync in a thread {_n(sync.per_second)} req/s = "
               f"{_x(ours.per_second / sync.per_second)} (median of the rounds' ratios "
               f"{_x(_median_ratio(http.rounds['async-ours'], http.rounds['sync-ours']))}); by CPU per request "
               f"(uvicorn + Redis) {_x((sync.app_cpu + sync.server_cpu) / (ours.app_cpu + ours.server_cpu))}",
               "pass" if ours.per_second > sync.per_second else "miss",
               _spread(http.rounds["async-ours"], http.rounds["sync-ours"])),
    ]


def _issue14_targets(results: Results) -> list[Target]:
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
                f"{_median(timing.usec[name]):.1f} vs {_median(timing.usec['incr']):.1f} us = "
                f"{_x(timing.ratio[name])}",
                "pass" if timing.ratio[name] <= bound else "miss",
                _spread(tuple(timing.usec[name]), tuple(timing.usec["incr"]))))
    return targets


def memory_targets(memory: list[MemoryResult]) -> list[Target]:
    """Section 3's targets: the exact sliding log per unit of limit, the O(1) algorithms per identity."""
    targets = []
    for m in [m for m in memory if m.variant == "ours.sliding_window" and m.rate.limit == 2000]:
        per_unit = m.memory_usage_per_identity / m.filled_to
        targets.append(Target(
            f"exact sliding log <= {LOG_BYTES_PER_UNIT:g} bytes per unit of limit at {m.rate}",
            "MEMORY USAGE per identity filled to its limit / the limit",
            f"{per_unit:.2f} bytes per unit ({_bytes(m.memory_usage_per_identity)} per identity)",
            "pass" if per_unit <= LOG_BYTES_PER_UNIT else "miss"))
    o1 = [m for m in memory if m.variant in {f"ours.{a}" for a in
                                             ("fixed_window", "sliding_window_counter", "token_bucket", "gcra")}]
    if o1:
        worst = max(o1, key=lambda m: m.memory_usage_per_identity)
        targets.append(Target(
            f"O(1) algorithms <= {O1_BYTES} bytes per identity and policy, key included",
            "MEMORY USAGE per identity, every O(1) algorithm of ours at every rate of section 3",
            f"worst: {BY_KEY[worst.variant].label} at {worst.rate}: {_bytes(worst.memory_usage_per_identity)}",
            "pass" if worst.memory_usage_per_identity <= O1_BYTES else "miss"))
    return targets


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _median_ratio(samples: tuple[float, ...], floors: tuple[float, ...]) -> float:
    """The median of the per-round ratios of two interleaved series (a second, paired view of their ratio)."""
    return _median([a / b for a, b in zip(samples, floors, strict=True) if b > 0]) if samples else math.nan


def _redis_time_section(results: Results) -> list[str]:
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
        rows.append([label, f"{_median(values):.2f}", _x(timing.ratio[name]),
                     " / ".join(f"{v:.1f}" for v in values)])
    lines += _table(["script", "usec_per_call (median)", "vs INCR (median of rounds)", "each round"], rows, "lrrl")
    return lines


def transport_targets(transports: Transports | None) -> list[Target]:
    """The async engine's target: AsyncRateLimiter.hit on the tier >= 0.9x a bare async EVALSHA."""
    if transports is None:
        return [Target(f"AsyncRateLimiter.hit, 3-policy tier >= {ENGINE_TARGET}x one bare async EVALSHA",
                       "paired rounds", "not run", "not measured")]
    targets = []
    for n in transports.tasks:
        tier, floor = f"async.tier/{n}", f"async.evalsha/{n}"
        ratio = transports.ratio(tier, floor)
        targets.append(Target(
            f"AsyncRateLimiter.hit, 3-policy tier >= {ENGINE_TARGET}x one bare async EVALSHA, {n} task(s)",
            f"1 process, {transports.duration:g} s of allowed traffic interleaved in bursts, same client",
            f"{_n(transports.per_second[tier])} vs {_n(transports.per_second[floor])} decisions/s = {_x(ratio)}; "
            f"by CPU per decision (client + Redis) {_x(transports.cpu[floor] / transports.cpu[tier])}",
            "pass" if ratio >= ENGINE_TARGET else "miss",
            _spread(transports.samples[tier], transports.samples[floor])))
    return targets


def transport_section(transports: Transports) -> list[str]:
    """The table of the engine's transports (bench/engine_bench.py: transport_rounds)."""
    lines = ["### The engine's transports, paired", "",
             "The sync engine on both of its paths and the async engine, each next to a bare EVALSHA of the "
             "INCR script from the same kind of client, in one worker process for "
             f"{transports.duration:g} s, allowed traffic (a new identity per decision). The rows take turns "
             "in bursts of 20 decisions per thread or task (Redis flushed before each turn of all rows), so that "
             "every row meets the same load from other work on the machine; decisions/s is each row's "
             "decisions over its own time, and *each fifth* the same over each fifth of the run. A sync row "
             "decides in one thread; an "
             "async row in N concurrent tasks of one event loop over one `redis.asyncio.Redis`. "
             "The speed paths are the defaults (`RateLimiter`: a connection per thread; `AsyncRateLimiter`: "
             "connections of its own, one per decision in flight); the *pool* paths are the reference paths "
             "(`connections=\"pool\"`; for `RateLimiter` the default under gevent/eventlet).", ""]
    return lines + _transport_table(transports)


def _transport_table(transports: Transports, prefix: str = "") -> list[str]:
    """One row per measured transport row (those whose name starts with `prefix`) and thread / task
    count, next to its bare EVALSHA."""
    rows = []
    floors = {"sync.tier": "sync.evalsha", "sync.tier.pool": "sync.evalsha", "async.tier": "async.evalsha",
              "async.tier.pool": "async.evalsha"}
    for key, per_second in transports.per_second.items():
        row, n = key.rsplit("/", 1)
        if not row.startswith(prefix):
            continue
        floor = floors.get(row)
        rows.append([TRANSPORTS[row], n, _n(per_second),
                     _x(transports.ratio(key, f"{floor}/{n}")) if floor else "",
                     _us(transports.cpu[key]), " / ".join(_n(v) for v in transports.samples[key])])
    return _table(["row", "threads / tasks", "decisions/s", "vs the bare EVALSHA", "CPU µs per decision "
                   "(client + Redis)", "each fifth /s"], rows, "lrrrrl")


# -- the document ----------------------------------------------------------------------------------
def _engine_section(results: Results) -> list[str]:
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
        allowed, denied = _engine(results, variant.key, "allowed"), _engine(results, variant.key, "denied")
        if allowed is None or denied is None:
            continue
        a1, an, d1, dn = allowed.run(1), allowed.run(n), denied.run(1), denied.run(n)
        name = f"**{variant.label}**" if variant.family == "ours" else variant.label
        rows.append([name, variant.algorithm, f"{allowed.round_trips:.2f} / {denied.round_trips:.2f}",
                     f"{_us(a1.client_cpu)} / {_us(a1.server_cpu)}" if a1 else "n/a",
                     _n(_rate(a1)), _n(_rate(an)), _n(_rate(d1)), _n(_rate(dn)),
                     f"{_us(a1.p50)} / {_us(a1.p99)}" if a1 else "n/a",
                     f"{_us(d1.p50)} / {_us(d1.p99)}" if d1 else "n/a"])
    lines += _table(header, rows, "llrrrrrrrr")
    leaks = [f"{BY_KEY[r.variant].label} ({r.mode}, {run.processes}p: {run.admitted} of {run.decisions} admitted)"
             for r in results.engine for run in r.runs
             if (r.mode == "allowed" and run.admitted != run.decisions)
             or (r.mode == "denied" and run.admitted > max(2, run.decisions // 100))]
    if leaks:
        lines += ["Runs whose traffic was not what its mode says (allowed traffic denied, or a hot identity "
                  "admitted more than the refill explains): " + "; ".join(leaks) + ".", ""]
    lines += [f"![decisions per second by limiter]({IMAGE.as_posix()})", ""]
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
        rows.append([str(paired.processes), str(paired.rounds), _n(ps.get("baseline", math.nan)),
                     _n(ps.get("baseline.raw", math.nan)), _n(ps.get("ours.tier", math.nan)),
                     _x(paired.ratio("ours.tier", "baseline")) if {"baseline", "ours.tier"} <= set(ps) else "n/a",
                     _x(paired.ratio("ours.tier", "baseline.raw")) if {"baseline.raw", "ours.tier"} <= set(ps)
                     else "n/a",
                     f"{_us(paired.cpu.get('baseline', math.nan))} / {_us(paired.cpu.get('ours.tier', math.nan))}",
                     " / ".join(_n(v) for v in paired.samples.get("ours.tier", ()))])
    lines += _table(["processes", "rounds", "baseline /s", "raw baseline /s", "tier /s", "tier / baseline",
                     "tier / raw", "CPU µs per decision, baseline / tier", "tier, each round /s"], rows)
    if results.transports is not None:
        lines += transport_section(results.transports)
    return lines


def _accuracy_section(results: Results) -> list[str]:
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
    lines += _table(["limiter", "exact algorithm?", "limit", "admitted per run", "result"], rows, "lllll")
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
        used = _bytes(result.used_memory_per_identity) if result.live_identities >= 100 else "—"
        rows.append([name, str(result.rate), live, f"{result.filled_to:,}", str(result.keys_per_identity),
                     _bytes(result.memory_usage_per_identity), used, "yes" if result.verified_full else "no"])
    lines += _table(["limiter", "rate", "identities", "filled to", "keys", "MEMORY USAGE bytes", "used_memory bytes",
                     "full"], rows, "llrrrrrl")
    return lines


def _http_section(results: Results) -> list[str]:
    from bench.http_bench import KEY_COUNT, SEEDED_TIER, seeded_limits
    from bench.httpapp.variants import HUGE_RATE, IP_ALGORITHM
    from bench.httpapp.variants import VARIANTS as HTTP_VARIANTS

    lines = ["## 4. HTTP: a trivial view under gunicorn", ""]
    http = results.http
    if http is None:
        return [*lines, f"Not measured: {results.http_note}.", ""]
    tier = ", ".join(f"{name} {algorithm} {limit:,}/{period}s" + (f" burst {burst:,}" if burst else "")
                     for name, algorithm, limit, period, burst in seeded_limits(SEEDED_TIER))
    lines += [
        f"`GET /api/ping` returns a small JSON body. gunicorn: {http.workers} workers x {http.threads} threads "
        f"(gthread, keep-alive, each worker holding at most its share of the load's connections, so that every worker "
        f"serves in every round), no access log; load: {http.generator}, {http.connections} keep-alive connections "
        f"from 127.0.0.1 for {http.duration:g} s after a 1 s warm-up, {results.sizes.http_rounds} round(s) "
        "interleaved over the variants (every variant's gunicorn is started first and stays up; each row is the "
        f"variant's median round). Nothing is denied (non-200 must be 0): peers limit at {HUGE_RATE} per client IP; "
        f"ours runs what a user gets: the default settings, the metrics on, the per-IP limit ({IP_ALGORITHM}, "
        f"`IP_RATE` {HUGE_RATE}, since every request comes from one address) and the seeded `{SEEDED_TIER}` tier "
        f"as `migrate` makes it ({tier}); each request sends the next of {KEY_COUNT} keys of that tier, so every "
        "key stays within its limits for a round. One EVALSHA per request decides the per-IP limit and the tier. "
        "Every variant's Redis client waits longer than the defaults (`BUDGET_MS` 10,000, `SOCKET_TIMEOUT` 10 s, "
        "bench/httpapp/settings.py), so that a loaded machine measures speed and not the fail mode; a reply "
        "waits through the same code either way.",
        "",
    ]
    floor = next((r.per_second for r in http.results if r.variant == "evalsha"), math.nan)
    rows = []
    for result in http.results:
        label, what = HTTP_VARIANTS[result.variant]
        name = f"**{label}**" if result.variant == "ours" else label
        rounds = " / ".join(_n(v) for v in http.rounds.get(result.variant, ()))
        rows.append([name, _n(result.per_second), _x(result.per_second / floor), _ms(result.p50), _ms(result.p99),
                     f"{_us(result.app_cpu)} / {_us(result.server_cpu)}", str(result.errors), rounds, what])
    lines += _table(["variant", "requests/s", "vs floor", "p50 ms", "p99 ms", "gunicorn / Redis CPU µs/request",
                     "non-200", "each round /s", "configured"], rows, "lrrrrrrrl")
    spreads = {v: max(r) / min(r) for v, r in http.rounds.items() if r and min(r) > 0}
    noisy = sorted(v for v, spread in spreads.items() if spread > 1.5)
    by_variant = {r.variant: r.per_second for r in http.results}
    if noisy or by_variant.get("none", math.inf) < by_variant.get("evalsha", 0.0):
        lines += ["**This run was noisy**: " + (f"the rounds of {', '.join(noisy)} differ by more than 1.5x"
                                                 if noisy else "")
                  + ("; " if noisy and by_variant.get("none", math.inf) < by_variant.get("evalsha", 0.0) else "")
                  + ("the view without a limiter measured slower than the floor"
                     if by_variant.get("none", math.inf) < by_variant.get("evalsha", 0.0) else "")
                  + ". The machine was busy with other work (see the load average above); treat the HTTP "
                    "verdicts of this run as uncertain and rerun on a quiet machine.", ""]
    if http.ours_headers:
        lines += ["Headers our middleware added to a response of the run:", "", "```",
                  *(f"{k}: {v}" for k, v in http.ours_headers.items()), "```", ""]
    if any(r.variant == "drf" for r in http.results):
        lines += ["DRF's throttle keeps every request timestamp of its window in one pickled list per client, "
                  "so with a huge limit and one client its per-request cost grows with the requests already in "
                  "the window (thousands here): that is DRF's design, not a tuning of this run.", ""]
    if results.http_unavailable:
        lines += ["Not run: " + "; ".join(f"{k} ({v})" for k, v in results.http_unavailable.items()) + ".", ""]
    return lines


#: The marker name of the ASGI section: a full run writes it in place, `bench/run.py --asgi-only` replaces it.
ASGI_SECTION = "asgi"


def asgi_section(section: AsgiSection) -> list[str]:
    """Section 6: the ASGI variants under uvicorn, with their targets and the async engine's."""
    from bench.httpapp.variants import ASGI_VARIANTS

    lines = ["## 6. HTTP under ASGI (uvicorn)", ""]
    if section.provenance:
        lines += [f"Measured on its own by {section.provenance}; the rest of this document comes from the run "
                  "named at the top.", ""]
    http = section.http
    targets = asgi_http_targets(section) + transport_targets(section.transports)
    lines += _targets_table(targets)
    if http is None:
        lines += [f"The HTTP rows were not measured: {section.note}.", ""]
    else:
        by = {r.variant: r for r in http.results}
        lines += [
            f"`GET /api/ping` served by an `async def` view returning the same small JSON body as section 4. "
            f"Server: {section.server}, `--no-access-log`, one uvicorn per variant, all started first and kept up; "
            f"load: {http.generator}, {http.connections} keep-alive connections from 127.0.0.1 for "
            f"{http.duration:g} s after a warm-up, {len(next(iter(http.rounds.values())))} round(s) interleaved over "
            "the four variants, each row the variant's median round. Every request sends the next of the keys of the "
            "seeded tier of section 4, with the same settings: nothing is denied, so non-200 must be 0.",
            "",
            f"**Machine**: {os.cpu_count()} cores, shared with other work running at the same time (load average "
            f"(1 min) at the start / end of these measurements: {section.load}); the load generator runs on the same "
            "cores. Absolute numbers are therefore low and rounds vary; the verdicts rest on the ratios of "
            "interleaved medians, and CPU per request is given as the less load-sensitive view.",
            "",
        ]
        floor = by["async-evalsha"].per_second if "async-evalsha" in by else math.nan
        rows = []
        for result in http.results:
            label, what = ASGI_VARIANTS[result.variant]
            name = f"**{label}**" if result.variant.endswith("ours") else label
            rows.append([name, _n(result.per_second), _x(result.per_second / floor), _ms(result.p50),
                         _ms(result.p99), f"{_us(result.app_cpu)} / {_us(result.server_cpu)}", str(result.errors),
                         " / ".join(_n(v) for v in http.rounds.get(result.variant, ())), what])
        lines += _table(["variant", "requests/s", "vs async floor", "p50 ms", "p99 ms",
                         "uvicorn / Redis CPU µs/request", "non-200", "each round /s", "configured"], rows, "lrrrrrrrl")
        noisy = sorted(v for v, r in http.rounds.items() if r and min(r) > 0 and max(r) / min(r) > NOISY_SPREAD)
        if noisy:
            lines += [f"**This run was noisy**: the rounds of {', '.join(noisy)} differ by more than "
                      f"{NOISY_SPREAD}x. Treat its verdicts as uncertain.", ""]
        lines += _rate_and_cpu(by)
        if {"async-none", "async-evalsha", "async-ours", "sync-ours"} <= set(by):
            none, floor_row, ours, sync = (by[v] for v in ("async-none", "async-evalsha", "async-ours", "sync-ours"))
            lines += [
                "From the CPU columns: uvicorn's process spends "
                f"{_us(none.app_cpu)} µs per request on the async view alone (Django's request handling included), "
                f"{_us(floor_row.app_cpu)} ({_signed_us(floor_row.app_cpu - none.app_cpu)}) with the floor's one "
                f"async EVALSHA, {_us(ours.app_cpu)} ({_signed_us(ours.app_cpu - floor_row.app_cpu)} over the floor) "
                f"with our async middleware, and {_us(sync.app_cpu)} ({_signed_us(sync.app_cpu - ours.app_cpu)} over "
                f"the async one) with our sync middleware in a thread. Redis spends {_us(ours.server_cpu)} µs per "
                f"request on our script (the per-IP limit and 3 policies) against {_us(floor_row.server_cpu)} µs on "
                "the INCR script (section 5 has the script's cost for a new identity). The bench tier's "
                "sliding_window is one API key's exact log at 1,000,000/min, which grows through the run (every "
                "admitted request adds a unit for a minute): a log that long has a key of its own, which a hit "
                "appends to, so its cost does not grow with the log (bench/hot_identity.py, docs/algorithms.md).",
                "",
            ]
        lines += _floor_budget(by)
        lines += _asgi_profile_table(section.profile)
        if http.ours_headers:
            lines += ["Headers our async middleware added to a response of the run:", "", "```",
                      *(f"{k}: {v}" for k, v in http.ours_headers.items()), "```", ""]
    if section.transports is not None:
        lines += ["The async engine's rows, from the same kind of run as section 1's transports table (one worker "
                  "process, rows taking turns in bursts, a new identity per decision):", ""]
        lines += _transport_table(section.transports, "async.")
        lines += _script_share(section)
    return lines


def _script_share(section: AsgiSection) -> list[str]:
    """How much of the 1-task gap between AsyncRateLimiter.hit and the bare EVALSHA is the script's time in
    Redis (with one decision in flight, a decision waits for the whole of it)."""
    transports, timing = section.transports, section.redis_time
    if transports is None or timing is None or not {"async.tier/1", "async.evalsha/1"} <= set(transports.per_second):
        return []
    gap = 1 / transports.per_second["async.tier/1"] - 1 / transports.per_second["async.evalsha/1"]
    script = (_median(timing.usec["tier"]) - _median(timing.usec["incr"])) * 1e-6
    return [f"With one task, a decision is one round trip, which waits for the script to run in Redis: the tier "
            f"takes {_signed_us(gap)} per decision over the bare EVALSHA, and Redis spends {_us(script)} µs more "
            f"running the tier's script than the INCR script (`usec_per_call` of each, "
            f"{_median(timing.usec['tier']):.1f} vs {_median(timing.usec['incr']):.1f} µs, measured in this run as "
            "in section 5).", ""]


#: requests/s times CPU per request of a process that one core limits (measurement noise either side)
CORE_BOUND = (0.9, 1.1)


def _floor_budget(by: dict[str, Any]) -> list[str]:
    """What the floor target leaves our middleware. uvicorn serves from one process: when each row keeps
    about one core busy, requests/s is 1 / the process' CPU per request, and the target bounds the CPU our
    middleware may add over the floor's."""
    if not {"async-evalsha", "async-ours"} <= set(by):
        return []
    cores = [r.per_second * r.app_cpu for r in by.values() if r.app_cpu > 0 and r.per_second > 0]
    # the budget holds only where uvicorn's CPU is what limits its requests/s (and CPU was measured)
    if len(cores) != len(by) or not all(CORE_BOUND[0] <= c <= CORE_BOUND[1] for c in cores):
        return []
    floor, ours = by["async-evalsha"], by["async-ours"]
    allowed = floor.app_cpu / HTTP_TARGET
    line = (f"What the {HTTP_TARGET}x target leaves our middleware: in every row, uvicorn's one process keeps "
            f"{min(cores):.2f} to {max(cores):.2f} of a core busy (requests/s times CPU per request), so its "
            f"requests/s is one core divided by its CPU per request, and the target bounds that CPU: at most "
            f"{_us(allowed)} µs per request, {_us(allowed - floor.app_cpu)} µs over the floor's {_us(floor.app_cpu)}, "
            "for all that the middleware does (who the client is, its plan, the call and its reply, the metrics, "
            f"the headers, and the Django and uvicorn work they cause). Ours adds {_us(ours.app_cpu - floor.app_cpu)}"
            " µs.")
    return [line, ""]


def _rate_and_cpu(by: dict[str, Any]) -> list[str]:
    """A warning when the floor target's verdict by requests/s and the ratio of CPU per request disagree."""
    if not {"async-ours", "async-evalsha"} <= set(by):
        return []
    ours, floor = by["async-ours"], by["async-evalsha"]
    by_rate = ours.per_second / floor.per_second >= HTTP_TARGET
    by_cpu = (floor.app_cpu + floor.server_cpu) / (ours.app_cpu + ours.server_cpu)
    if by_rate == (by_cpu >= HTTP_TARGET):
        return []
    verdict = ("the pass by requests/s is not established" if by_rate
               else "the miss by requests/s may be the machine's noise")
    return [f"**Rate and CPU disagree** on the {HTTP_TARGET}x target: by CPU per request (uvicorn + Redis) our async "
            f"middleware is {_x(by_cpu)} of the floor. Where the server's CPU is the limit, requests/s follow CPU per "
            f"request, so {verdict}.", ""]


def _asgi_profile_table(profile: AsgiProfile | None) -> list[str]:
    """GIL time per request by part, per ASGI variant (bench/asgi_profile.py), with uvicorn's CPU."""
    from bench.httpapp.variants import ASGI_VARIANTS

    if profile is None:
        return []
    if profile.note:
        return [f"The profile of where the time goes was not taken: {profile.note}.", ""]
    variants = [v for v in ASGI_VARIANTS if v in profile.per_request]
    lines = [f"Where the time goes, by profile: py-spy ({profile.rate} samples/s, `--gil`: only the thread holding "
             f"the GIL) on a fresh uvicorn per variant for {profile.seconds:g} s of the same load. A cell is the GIL "
             "time per request of that part (samples / rate / requests served); a sample belongs to the part of its "
             "innermost frame that names one (bench/asgi_profile.py). One GIL serializes the process, so *all* bounds "
             "its requests/s (1 / all); the sampling is by wall clock, so a thread that the OS preempts while holding "
             "the GIL counts, and on a loaded machine every part is inflated. The last row is the uvicorn process' "
             "CPU per request over the same load, all threads and system time included.", "",
             "Django's ASGIHandler runs each request in a `ThreadSensitiveContext`, sends `request_started` and "
             "`request_finished` (whose receivers `reset_queries` and `close_old_connections` are sync) through "
             "`sync_to_async`, and closes the response the same way: every request starts a thread and joins it, "
             "with or without a limiter (the *thread hand-offs* row). The rows every variant shares (thread "
             "hand-offs, uvicorn, Django, the loop) show how noisy a short profile on a loaded machine is: read it "
             "for the shape of a request, not for ratios.", ""]
    rows = []
    for part in [name for name, _ in PARTS] + [LOOP]:
        values = [profile.per_request[v].get(part, 0.0) for v in variants]
        if any(values):
            rows.append([part, *(_us(value) for value in values)])
    rows.append(["**all**", *(_us(sum(profile.per_request[v].values())) for v in variants)])
    rows.append(["uvicorn CPU", *(_us(profile.cpu[v]) for v in variants)])
    lines += _table(["µs per request", *(ASGI_VARIANTS[v][0] for v in variants)], rows)
    return lines


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def _targets_table(targets: list[Target]) -> list[str]:
    status_mark = {"pass": "**pass**", "miss": "**MISS**"}
    return _table(["target", "how it is judged", "measured", "result"],
                  [[t.promise, t.rule, t.measured, status_mark.get(t.status, t.status)
                    + (f" (noisy: rounds {t.spread:.1f}x apart)" if t.spread > NOISY_SPREAD else "")]
                   for t in targets], "llll")


def render(results: Results, targets: list[Target]) -> str:
    """The Markdown document."""
    s = results.sizes
    lines = [
        "# Benchmarks",
        "",
        "Generated by `bench/run.py`; do not edit by hand. To reproduce, from the repository root:",
        "",
        "```bash",
        "apt-get install -y wrk        # optional: without wrk a bounded Python client generates the HTTP load",
        "python3 bench/run.py          # creates .bench-venv/ with the peers, then runs everything (about 12 min)",
        "```",
        "",
        f"This run: `{results.command}` ({s.name} sizes), finished {results.finished}, took "
        f"{results.duration:.0f} s. It started its own `redis-server` on a free loopback port.",
        "",
        "## Targets",
        "",
    ]
    lines += _targets_table(targets)
    lines += [f"A verdict marked *noisy* rests on rounds more than {NOISY_SPREAD}x apart (see the load average "
              "below): the machine was busy with other work during the run, so that verdict may flip on a rerun. "
              "CPU time per decision / request is given next to the rates as a second, less load-sensitive view.",
              ""]
    lines += ["## Machine and versions", ""]
    lines += _table(["", ""], [[k, v] for k, v in results.machine.items()]
                    + [[k, v] for k, v in results.versions.items()], "ll")
    lines += _engine_section(results)
    lines += _accuracy_section(results)
    lines += [marked_section(MEMORY_SECTION, "\n".join(memory_section(results.memory)))]
    lines += _http_section(results)
    lines += _redis_time_section(results)
    if results.asgi is not None:
        lines += [marked_section(ASGI_SECTION, "\n".join(asgi_section(results.asgi)))]
    lines += ["## What each limiter row calls", ""]
    lines += [f"- **{v.label}**: {_first_paragraph(v.builder.__doc__)}" + (f" ({v.note})" if v.note else "")
              for v in VARIANTS if v.key not in results.unavailable]
    lines += [""]
    if results.unavailable:
        lines += ["## Not run in this environment", ""]
        lines += [f"- {BY_KEY[key].label}: {why}" for key, why in results.unavailable.items()]
        lines += ["", "`python bench/run.py` (without `--here` / `--smoke`) installs every peer into "
                      ".bench-venv/ first.", ""]
    return "\n".join(lines)


def chart(results: Results, path: Path) -> str | None:
    """Draw decisions/s by limiter (allowed and denied, 1 and N processes); None, or why it was not drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"matplotlib is not installed ({exc})"
    n = results.sizes.processes
    variants = [v for v in VARIANTS if _engine(results, v.key, "allowed") and _engine(results, v.key, "denied")]
    colors = {"baseline": "#888888", "ours": "#1f77b4", "peer": "#ff7f0e"}
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(14, 0.42 * len(variants) + 2), sharey=True)
    axes[0].invert_yaxis()  # first variant on top (the axes share y: invert once)
    for ax, mode in zip(axes, ("allowed", "denied"), strict=True):
        y = list(range(len(variants)))
        one = [_rate(_run(results, v.key, mode, 1)) for v in variants]
        many = [_rate(_run(results, v.key, mode, n)) for v in variants]
        ax.barh([i - 0.2 for i in y], one, height=0.4, color=[colors[v.family] for v in variants], alpha=0.55,
                label="1 process")
        ax.barh([i + 0.2 for i in y], many, height=0.4, color=[colors[v.family] for v in variants],
                label=f"{n} processes")
        ax.set_yticks(y)
        ax.set_yticklabels([v.label for v in variants], fontsize=8)
        if mode == "denied":
            # a local deny cache answers an order of magnitude faster than any round trip
            ax.set_xscale("log")
            ax.set_xlim(left=500)
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        ax.set_title(f"{mode} traffic" + (" (one hot identity over its limit; log scale)" if mode == "denied"
                                          else " (distinct identities)"))
        ax.set_xlabel("decisions per second (higher is better)")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(handles=[Patch(color="#555555", alpha=0.55, label="1 process"),
                           Patch(color="#555555", label=f"{n} processes")], loc="lower right", fontsize=8)
    fig.suptitle(f"Rate limiter decisions per second: light bars 1 process, dark bars {n} processes "
                 "(grey baseline, blue ours, orange peers)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


#: The repository root (the scripts' sections go into its docs/benchmarks.md).
ROOT = Path(__file__).resolve().parent.parent

#: Sections of benchmarks.md written by other benchmark scripts (bench/concurrency_bench.py --write,
#: bench/gateway_bench.py --write), each between its markers: kept when this report is written again.
KEPT_START = "<!-- section: "
KEPT_END = "<!-- end of section -->"


def kept_sections(text: str, written: str = "") -> str:
    """The marked sections of an existing benchmarks.md that the new document `written` does not have
    itself, in order ("" when there are none)."""
    sections = []
    for part in text.split(KEPT_START)[1:]:
        body, found, _ = part.partition(KEPT_END)
        if found and KEPT_START + body.partition("\n")[0] not in written:
            sections.append(KEPT_START + body + KEPT_END + "\n")
    return "\n".join(sections)


def marked_section(name: str, section: str) -> str:
    """`section` between the markers of the section `name` (which replace_section finds again)."""
    return f"{KEPT_START}{name} -->\n{section.rstrip()}\n{KEPT_END}\n"


def replace_section(text: str, name: str, section: str) -> str:
    """`text` (benchmarks.md) with the marked section `name` replaced by `section` (appended if absent)."""
    start = f"{KEPT_START}{name} -->"
    block = marked_section(name, section)
    if start in text:
        before, _, rest = text.partition(start)
        _, _, after = rest.partition(KEPT_END + "\n")
        return before + block + after
    return text.rstrip("\n") + "\n\n" + block if text.strip() else block


def write_script_section(name: str, title: str, script: str, intro: list[str], lines: list[str],
                         load_at_start: float, load_at_end: float) -> None:
    """Put the results `lines` of another benchmark script (`script`, run with --write) into
    docs/benchmarks.md as the marked section `name` under `title`, after `intro`, with when, at which
    commit and at which load it ran (`write` keeps the section when it writes the rest)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join([
        title, "",
        f"Written by `python3 {script} --write` (not by `bench/run.py`, which keeps this section).",
        *intro, "",
        f"This run: {when}, commit {commit.stdout.strip() or '?'}, load average (1 min) at start / end "
        f"{load_at_start:.2f} / {load_at_end:.2f}.",
        "",
        *lines,
    ])
    path = ROOT / "docs" / "benchmarks.md"
    path.write_text(replace_section(path.read_text(encoding="utf-8"), name, section), encoding="utf-8")


def write(results: Results, output: Path) -> None:
    """Write benchmarks.md and img/benchmarks.png into `output` (keeping the marked sections of other
    benchmark scripts)."""
    output.mkdir(parents=True, exist_ok=True)
    targets = evaluate(results)
    text = render(results, targets)
    problem = chart(results, output / IMAGE)
    if problem:
        text = text.replace(f"![decisions per second by limiter]({IMAGE.as_posix()})",
                            f"(chart not drawn: {problem})")
    previous = output / "benchmarks.md"
    kept = kept_sections(previous.read_text(encoding="utf-8"), text) if previous.exists() else ""
    (output / "benchmarks.md").write_text(text + "\n" + ("\n" + kept if kept else ""), encoding="utf-8")


def write_memory(memory: list[MemoryResult], provenance: str, output: Path) -> None:
    """Replace section 3 of `output`/benchmarks.md with `memory` (appended if absent; the file is created if
    missing) and its targets' rows in the targets table, leaving everything else in it as it is."""
    output.mkdir(parents=True, exist_ok=True)
    path = output / "benchmarks.md"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    text = replace_section(text, MEMORY_SECTION, "\n".join(memory_section(memory, provenance)))
    for target in memory_targets(memory):
        row = _targets_table([target])[2]
        text = "\n".join(row if line.startswith(f"| {target.promise} |") else line for line in text.split("\n"))
    path.write_text(text, encoding="utf-8")


def write_asgi(section: AsgiSection, output: Path) -> None:
    """Replace the ASGI section of `output`/benchmarks.md with `section` (appended if absent; the file is
    created if missing), leaving everything else in it as it is."""
    output.mkdir(parents=True, exist_ok=True)
    path = output / "benchmarks.md"
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    path.write_text(replace_section(text, ASGI_SECTION, "\n".join(asgi_section(section))), encoding="utf-8")
