"""Sections 4 and 6 of the report (HTTP under gunicorn, HTTP under uvicorn) and their targets: every
row as a ratio to the lean reference middleware (bench/httpapp/reference.py), measured side by side."""

from __future__ import annotations

import math
import os
from typing import Any

from bench.asgi_profile import LOOP, PARTS, AsgiProfile
from bench.report_text import (
    NOISY_SPREAD,
    Target,
    median,
    median_ratio,
    msec,
    num,
    signed_usec,
    spread,
    table,
    targets_table,
    times,
    usec,
)
from bench.results import AsgiSection
from bench.transports import transport_table, transport_targets

#: Ours against the lean reference middleware, under gunicorn and under uvicorn.
REFERENCE_TARGET = 0.95
#: Ours against every peer variant under gunicorn.
PEER_TARGET = 1.1
#: The peers' HTTP variants.
PEERS = ("drf", "django-ratelimit", "smart")
#: The marker names of sections 4 and 6: a full run writes them in place, `bench/run.py --http-only`
#: replaces both (and the HTTP rows of the targets table), `--asgi-only` section 6.
HTTP_SECTION = "http"
ASGI_SECTION = "asgi"


def _paired(http: Any, variant: str, to: str) -> float:
    """The median over the rounds of `variant`'s requests/s over `to`'s in the same round."""
    return median_ratio(http.rounds.get(variant, ()), http.rounds.get(to, ()))


def reference_targets(http: Any, ours: str, reference: str, where: str, why: str) -> list[Target]:
    """Ours >= REFERENCE_TARGET x the reference under `where` (and, under gunicorn, >= PEER_TARGET x every
    peer), each judged by the median of the rounds' ratios; `why` when the rows did not run."""
    promise = f"HTTP ({where}): our middleware >= {REFERENCE_TARGET}x the lean reference middleware"
    peers_promise = f"HTTP ({where}): our middleware >= {PEER_TARGET}x every peer variant"
    by = {r.variant: r for r in http.results} if http is not None else {}
    peers = [p for p in PEERS if p in by] if where == "gunicorn" else []
    if ours not in by or reference not in by:
        missing = [Target(promise, f"requests/s under {where}", why or "not every variant ran", "not measured")]
        return missing + ([Target(peers_promise, f"requests/s under {where}", why, "not measured")]
                          if where == "gunicorn" else [])
    rule = f"median of {len(http.rounds[ours])} alternating rounds' ratios of requests/s, same view, same load"
    ratio = _paired(http, ours, reference)
    o, ref = by[ours], by[reference]
    targets = [Target(promise, rule, f"{times(ratio)} ({num(o.per_second)} vs {num(ref.per_second)} req/s, medians); "
                      f"by CPU per request (server + Redis) "
                      f"{times((ref.app_cpu + ref.server_cpu) / (o.app_cpu + o.server_cpu))}",
                      "pass" if ratio >= REFERENCE_TARGET else "miss",
                      spread(http.rounds[ours], http.rounds[reference]))]
    if peers:
        ratios = {p: _paired(http, ours, p) for p in peers}
        worst = min(ratios, key=lambda p: ratios[p])
        targets.append(Target(peers_promise, rule, "; ".join(f"vs {p} {times(r)}" for p, r in ratios.items()),
                              "pass" if ratios[worst] >= PEER_TARGET else "miss",
                              spread(http.rounds[ours], http.rounds[worst])))
    return targets


def _cpu_ratio(http: Any, variant: str, to: str) -> float:
    """`to`'s CPU per request (server + Redis) over `variant`'s: the ratio of requests/s the CPU allows."""
    by = {r.variant: r for r in http.results}
    if variant not in by or to not in by:
        return math.nan
    return (by[to].app_cpu + by[to].server_cpu) / (by[variant].app_cpu + by[variant].server_cpu)


def http_table(http: Any, labels: dict[str, tuple[str, str]], reference: str, floor: str) -> list[str]:
    """One row per variant: requests/s, as a ratio to the reference (median of the rounds' ratios, and by
    CPU per request) and to the one-EVALSHA floor, latency, CPU per request, non-200 answers, every round."""
    rows = []
    for result in http.results:
        label, what = labels[result.variant]
        name = f"**{label}**" if result.variant.endswith("ours") or result.variant.endswith("reference") else label
        rows.append([name, num(result.per_second), times(_paired(http, result.variant, reference)),
                     times(_cpu_ratio(http, result.variant, reference)), times(_paired(http, result.variant, floor)),
                     msec(result.p50), msec(result.p99), f"{usec(result.app_cpu)} / {usec(result.server_cpu)}",
                     str(result.errors), " / ".join(num(v) for v in http.rounds.get(result.variant, ())), what])
    lines = table(["variant", "requests/s", "vs reference", "vs reference by CPU", "vs floor", "p50 ms", "p99 ms",
                   f"{http.server} / Redis CPU µs/request", "non-200", "each round /s", "configured"], rows,
                  "lrrrrrrrrrl")
    noisy = sorted(v for v, r in http.rounds.items() if r and min(r) > 0 and max(r) / min(r) > NOISY_SPREAD)
    if noisy:
        lines += [f"**This run was noisy**: the rounds of {', '.join(noisy)} differ by more than {NOISY_SPREAD}x "
                  "(the machine was busy with other work). The ratios are medians of each round's ratio, which "
                  "a disturbance shared by neighbouring variants moves less than the rates.", ""]
    return lines


def _reference_note(server: str) -> list[str]:
    return [f"*vs reference* is each row's requests/s over the lean reference middleware's in the same round, the "
            f"median over the rounds (*vs floor* the same against the one-EVALSHA view); *by CPU* is the reference's "
            f"CPU per request ({server} and Redis) over the row's, the ratio of requests/s that CPU allows, which "
            f"other work on the machine moves far less than requests/s. The reference "
            f"(bench/httpapp/reference.py) is what these features cost under {server}: plain code doing for this "
            "request exactly what ours does (the API key and its tier, the same EVALSHA with the same KEYS and ARGV, "
            "the same six headers, a count per request) and nothing else.", ""]


def http_section(http: Any, note: str, unavailable: dict[str, str], rounds: int, provenance: str = "") -> list[str]:
    """Section 4: the WSGI variants under gunicorn (`provenance`: how it was measured, when on its own)."""
    from bench.http_bench import KEY_COUNT, SEEDED_TIER, seeded_limits
    from bench.httpapp.variants import HUGE_RATE, IP_ALGORITHM, PEER_RATE
    from bench.httpapp.variants import VARIANTS as HTTP_VARIANTS

    lines = ["## 4. HTTP: a trivial view under gunicorn", ""]
    if provenance:
        lines += [f"Measured on its own, with section 6, by {provenance}; the rest of this document comes from the "
                  "run named at the top.", ""]
    if http is None:
        return [*lines, f"Not measured: {note}.", ""]
    tier = ", ".join(f"{name} {algorithm} {limit:,}/{period}s" + (f" burst {burst:,}" if burst else "")
                     for name, algorithm, limit, period, burst in seeded_limits(SEEDED_TIER))
    workers = (f"{http.workers} sync workers (gunicorn's default class: one request at a time, the connection "
               "closed after each answer)" if http.threads <= 0 else
               f"{http.workers} workers x {http.threads} threads (gthread, keep-alive)")
    lines += [
        f"`GET /api/ping` returns a small JSON body. gunicorn: {workers}, no access log; load: {http.generator}, "
        f"{http.connections} connections from 127.0.0.1 for {http.duration:g} s after a 1 s warm-up, {rounds} "
        "round(s) alternating over the variants (every variant's gunicorn is started first and stays up; each row "
        f"is the variant's median round). Each request sends the next of {KEY_COUNT} API keys of the seeded "
        f"`{SEEDED_TIER}` tier as `migrate` makes it ({tier}), so no key reaches its limits in a round: nothing is "
        "denied (non-200 must be 0). Ours runs what a user gets: the default settings, the metrics on, the per-IP "
        f"limit ({IP_ALGORITHM}; `IP_RATE` {HUGE_RATE}, the tier's own per-IP rate applying) and the key's tier, in "
        f"one EVALSHA. Each peer is configured as its documentation shows a user: its limit per API key (the "
        f"X-API-Key header) at the tier's per-minute rate, {PEER_RATE}, on the same Redis. Every Redis client "
        "waits longer than the defaults (bench/httpapp/settings.py), so that a loaded machine measures speed, "
        "not the fail mode.", "", *_reference_note("gunicorn")]
    lines += http_table(http, HTTP_VARIANTS, "reference", "evalsha")
    if http.ours_headers:
        lines += ["Headers our middleware added to a response of the run:", "", "```",
                  *(f"{k}: {v}" for k, v in http.ours_headers.items()), "```", ""]
    if unavailable:
        lines += ["Not run: " + "; ".join(f"{k} ({v})" for k, v in unavailable.items()) + ".", ""]
    return lines


def asgi_targets(section: AsgiSection) -> list[Target]:
    """Section 6's targets: our async middleware >= 0.95x the async reference, and ahead of our sync
    middleware run in a thread."""
    http = section.http
    targets = reference_targets(http, "async-ours", "async-reference", "uvicorn", section.note)
    promise = "HTTP (uvicorn): our async middleware ahead of our sync middleware under ASGI"
    by = {r.variant: r for r in http.results} if http is not None else {}
    if not {"async-ours", "sync-ours"} <= set(by):
        return [*targets, Target(promise, "requests/s under uvicorn", section.note or "did not run", "not measured")]
    ratio = _paired(http, "async-ours", "sync-ours")
    return [*targets, Target(promise, "median of the alternating rounds' ratios of requests/s", times(ratio),
                             "pass" if ratio > 1 else "miss",
                             spread(http.rounds["async-ours"], http.rounds["sync-ours"]))]


def asgi_section(section: AsgiSection) -> list[str]:
    """Section 6: the ASGI variants under uvicorn, with their targets and the async engine's."""
    from bench.httpapp.variants import ASGI_VARIANTS

    lines = ["## 6. HTTP under ASGI (uvicorn)", ""]
    if section.provenance:
        lines += [f"Measured on its own by {section.provenance}; the rest of this document comes from the run "
                  "named at the top.", ""]
    http = section.http
    lines += targets_table(asgi_targets(section) + transport_targets(section.transports))
    if http is None:
        lines += [f"The HTTP rows were not measured: {section.note}.", ""]
    else:
        lines += [
            f"`GET /api/ping` served by an `async def` view returning the same small JSON body as section 4. "
            f"Server: {section.server}, `--no-access-log`, one uvicorn per variant, all started first and kept up; "
            f"load: {http.generator}, {http.connections} keep-alive connections from 127.0.0.1 for "
            f"{http.duration:g} s after a warm-up, {len(next(iter(http.rounds.values())))} round(s) alternating over "
            "the variants, each row the variant's median round. Every request sends the next of the keys of "
            "section 4, with the same settings: nothing is denied, so non-200 must be 0. Machine: "
            f"{os.cpu_count()} cores shared with the load generator (load average (1 min) at the start / end: "
            f"{section.load}).", "", *_reference_note("uvicorn")]
        lines += http_table(http, ASGI_VARIANTS, "async-reference", "async-evalsha")
        lines += _asgi_profile_table(section.profile)
        if http.ours_headers:
            lines += ["Headers our async middleware added to a response of the run:", "", "```",
                      *(f"{k}: {v}" for k, v in http.ours_headers.items()), "```", ""]
    if section.transports is not None:
        lines += ["The async engine's rows, from the same kind of run as section 1's transports table (one worker "
                  "process, rows taking turns in bursts, a new identity per decision):", ""]
        lines += transport_table(section.transports, "async.")
        lines += _script_share(section)
    return lines


def _script_share(section: AsgiSection) -> list[str]:
    """How much of the 1-task gap between AsyncRateLimiter.hit and the bare EVALSHA is the script's time in
    Redis (with one decision in flight, a decision waits for the whole of it)."""
    transports, timing = section.transports, section.redis_time
    if transports is None or timing is None or not {"async.tier/1", "async.evalsha/1"} <= set(transports.per_second):
        return []
    gap = 1 / transports.per_second["async.tier/1"] - 1 / transports.per_second["async.evalsha/1"]
    script = (median(timing.usec["tier"]) - median(timing.usec["incr"])) * 1e-6
    return [f"With one task, a decision is one round trip, which waits for the script to run in Redis: the tier "
            f"takes {signed_usec(gap)} per decision over the bare EVALSHA, and Redis spends {usec(script)} µs more "
            f"running the tier's script than the INCR script (`usec_per_call` of each, "
            f"{median(timing.usec['tier']):.1f} vs {median(timing.usec['incr']):.1f} µs, measured in this run as "
            "in section 5).", ""]


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
             "innermost frame that names one (bench/asgi_profile.py). Sampling is by wall clock, so on a loaded "
             "machine every part is inflated: read it for the shape of a request, not for ratios. The last row is "
             "the uvicorn process' CPU per request over the same load. Django's ASGIHandler hands every request "
             "to a thread and back (`sync_to_async` for its signals and the response's close), with or without a "
             "limiter: the *thread hand-offs* row.", ""]
    rows = []
    for part in [name for name, _ in PARTS] + [LOOP]:
        values = [profile.per_request[v].get(part, 0.0) for v in variants]
        if any(values):
            rows.append([part, *(usec(value) for value in values)])
    rows.append(["**all**", *(usec(sum(profile.per_request[v].values())) for v in variants)])
    rows.append(["uvicorn CPU", *(usec(profile.cpu[v]) for v in variants)])
    return lines + table(["µs per request", *(ASGI_VARIANTS[v][0] for v in variants)], rows)


def summary(gunicorn: Any, uvicorn: Any) -> list[str]:
    """The ratios to the reference of both servers, one line per variant (what `--http-only` prints)."""
    lines = []
    for http, reference in ((gunicorn, "reference"), (uvicorn, "async-reference")):
        if http is None or reference not in http.rounds:
            continue
        lines.append(f"{http.server} ({len(http.rounds[reference])} alternating rounds): requests/s, its ratio to the "
                     "lean reference middleware (median of the rounds' ratios), the same ratio by CPU per request "
                     f"({http.server} + Redis), and that CPU:")
        lines += [f"  {r.variant:<18} {num(r.per_second):>7} req/s  {times(_paired(http, r.variant, reference)):>6}"
                  f"  by CPU {times(_cpu_ratio(http, r.variant, reference)):>6}  "
                  f"({usec(r.app_cpu)} + {usec(r.server_cpu)} µs/request)" for r in http.results]
    return lines
