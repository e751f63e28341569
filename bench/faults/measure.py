"""What one row (one fault, one fail mode, one store) did, measured from outside: the clients' records,
the ledger the protected view wrote, and the store read after the load.

A window is *exact* when every key had exactly LIMIT requests served in it, all decided by the store
(none degraded), and no client got a 503 in it: what the limiter does with a healthy store. Seconds
until exact again are counted from the heal to the start of the first window from which every window
of the row is exact (so they are a multiple of the window, rounded up).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from .load import Sent
from .tiers import LIMIT, WINDOW

Ledger = dict[str, dict[int, list[int]]]  # identity -> window -> [served by the store's decision, degraded]


@dataclass(frozen=True)
class Timeline:
    start: float  # the load starts
    fault: float  # the fault is injected
    healed: float  # the fault is over
    end: float  # the load stops


@dataclass
class RowResult:
    store: str
    mode: str
    fault: str
    requests: int
    served: int  # 200s the clients got
    over_max: int  # the most requests served over LIMIT in one window of one key
    over_total: int  # requests served over LIMIT, all windows and keys of the row together
    refused_429: int
    refused_503: int  # the fail mode's (or the limiter's) 503, in its JSON shape
    errors_5xx: int  # any other 5xx
    no_answer: int  # no HTTP answer at all (a killed worker's connections)
    p50_ms: float
    p99_ms: float
    exact_after: float | None  # None: not exact again before the row ended
    lasted: float  # seconds from the injection to the heal
    view_minus_clients: int  # served at the view minus 200s the clients saw
    slots_held_after_fault: int = 0  # by the requests that hold slots on purpose (the worker kill's)
    held_served: int = 0  # those requests served at the view (admitted: the metrics count them as allowed)
    slots_held_at_end: int = 0
    slots_leaked: int = 0  # still held after the lease (must be 0)
    metrics: dict[str, int] = field(default_factory=dict)  # allowed/blocked: counted minus seen by clients
    metrics_lost_with: str = ""  # the fault's `loses`
    note: str = ""  # what the fault reported (slots moved)
    p99_by_server: dict[str, float] = field(default_factory=dict)  # the p99 of the requests each server answered


def parse_ledger(raw: dict[str, str]) -> Ledger:
    ledger: Ledger = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for name, count in raw.items():
        identity, window, degraded = name.rsplit("|", 2)
        ledger[identity][int(window)][int(degraded)] += int(count)
    return ledger


def identity_of(key: str) -> str:
    return f"key:{key.split('.')[0]}"


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(share * 100) - 1]


def exact_windows(keys: list[str], ledger: Ledger, records: list[Sent], first: int, last: int) -> dict[int, bool]:
    unavailable = {(record.key, int(record.sent // WINDOW)) for record in records if record.status in (0, 503)}
    exact = {}
    for window in range(first, last + 1):
        exact[window] = all(
            ledger[identity_of(key)][window] == [LIMIT, 0] and (index, window) not in unavailable
            for index, key in enumerate(keys))
    return exact


def exact_after(keys: list[str], ledger: Ledger, records: list[Sent], times: Timeline) -> float | None:
    """Seconds from the heal to the first window from which all windows of the row are exact."""
    first, last = math.ceil(times.start / WINDOW) + 1, math.floor(times.end / WINDOW) - 1
    exact = exact_windows(keys, ledger, records, first, last)
    if not exact or not exact[last]:
        return None
    window = last
    while window - 1 >= first and exact[window - 1] and (window - 1) * WINDOW >= times.fault - WINDOW:
        window -= 1
    return max(0.0, window * WINDOW - times.healed)


def measure_row(store: str, mode: str, fault: str, keys: list[str], records: list[Sent], ledger: Ledger,
                times: Timeline) -> RowResult:
    excess = [max(0, sum(counts) - LIMIT) for key in keys for counts in ledger[identity_of(key)].values()]
    during = [record for record in records if times.fault <= record.sent <= times.healed + 1.0 and record.status] \
        or [record for record in records if record.status]
    latency = {server: [r.done - r.sent for r in during if r.server == server] for server in ("gunicorn", "uvicorn")}
    served_at_view = sum(sum(counts) for key in keys for counts in ledger[identity_of(key)].values())
    served = sum(record.status == 200 for record in records)
    return RowResult(
        store=store, mode=mode, fault=fault, requests=len(records), served=served,
        over_max=max(excess, default=0), over_total=sum(excess),
        refused_429=sum(record.status == 429 for record in records),
        refused_503=sum(record.status == 503 and record.ours for record in records),
        errors_5xx=sum(record.status >= 500 and not (record.status == 503 and record.ours) for record in records),
        no_answer=sum(record.status == 0 for record in records),
        p50_ms=1000 * _percentile([r.done - r.sent for r in during], 0.5),
        p99_ms=1000 * _percentile([r.done - r.sent for r in during], 0.99),
        p99_by_server={server: 1000 * _percentile(values, 0.99) for server, values in latency.items()},
        exact_after=exact_after(keys, ledger, records, times), lasted=times.healed - times.fault,
        view_minus_clients=served_at_view - served,
    )
