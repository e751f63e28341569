"""One session: a store, one fail mode, the demo's servers, and the faults of that store one after another.

Each row gets its own tier and keys (so its counts, metrics and slots are its own), a baseline of steady
load, the fault, and load until its windows are exact again (or MAX_RECOVERY seconds). After the last
row: the slots each row's keys still hold once the lease has run out, the servers stopped (their metrics
flushed), the metrics counted against what the clients saw, and the keys without a TTL.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import time
from pathlib import Path

import redis

from .apps import LOADED, AppServers, environment
from .faults import Context, Fault
from .load import Load
from .measure import RowResult, Timeline, exact_windows, identity_of, measure_row, parse_ledger
from .stores import start_store
from .tiers import BASELINE, LEASE, LEDGER_KEY, MAX_RECOVERY, SLOTS, WINDOW


def free_slots(port: int, key: str) -> int | None:
    """Free slots of `key` as the status endpoint reports them from the store (None: no answer, or one
    made without the store: a breaker still open right after the fault)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/api/rate-limit/status", headers={"X-API-Key": key})
        body = json.loads(connection.getresponse().read())
        if body.get("degraded"):
            return None
        return next(int(limit["remaining"]) for limit in body["limits"] if limit["name"] == "slots")
    except (OSError, ValueError, KeyError, TypeError, StopIteration, http.client.HTTPException):
        return None
    finally:
        connection.close()


def held_slots(port: int, keys: list[str], patience: float = 10.0) -> int:
    """Slots the keys hold, asked until the store answers (at most `patience` seconds; -1: it never did)."""
    deadline = time.monotonic() + patience
    held = 0
    for key in keys:
        while (free := free_slots(port, key)) is None:
            if time.monotonic() > deadline:
                return -1
            time.sleep(0.2)
        held += SLOTS - free
    return held


def _settled(keys: list[str], ledger: redis.Redis, load: Load, healed: float, fault: Fault) -> bool:
    now = time.time()
    if now - healed < fault.settle:
        return False
    if now - healed > MAX_RECOVERY:
        return True
    last = math.floor(now / WINDOW) - 1
    with load._lock:
        records = list(load.records)
    exact = exact_windows(keys, parse_ledger(_ledger(ledger)), records, last, last)
    return all(exact.values()) and last * WINDOW >= healed


def _ledger(client: redis.Redis) -> dict[str, str]:
    return {str(name): str(count) for name, count in client.hgetall(LEDGER_KEY).items()}


def run_row(store: str, mode: str, fault: Fault, context: Context, ledger: redis.Redis) -> RowResult:
    load = Load(context.keys[:LOADED], context.apps.urls)
    start = time.time()
    load.start()
    time.sleep(BASELINE)
    injected = time.time()
    note = fault.inject(context)
    healed = time.time()
    holder_slots = held_slots(dict(context.apps.urls)["gunicorn"], context.keys[LOADED:])
    while not _settled(context.keys[:LOADED], ledger, load, healed, fault):
        time.sleep(0.25)
    records = load.stop()
    times = Timeline(start, injected, healed, time.time())
    result = measure_row(store, mode, fault.name, context.keys[:LOADED], records,
                         parse_ledger(_ledger(ledger)), times)
    result.slots_held_after_fault = holder_slots
    result.note = "" if note is None else str(note)
    held = parse_ledger(_ledger(ledger))[identity_of(context.keys[LOADED])]
    result.held_served = sum(sum(counts) for counts in held.values())
    result.slots_held_at_end = held_slots(dict(context.apps.urls)["gunicorn"], context.keys)
    result.metrics_lost_with = fault.loses
    return result


def _metric_counts(nodes: list[redis.Redis], prefix: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for client in nodes:
        for key in client.scan_iter(match=f"{prefix}:{{metrics}}:h:*", count=1000):
            for name, value in client.hgetall(key).items():
                counts[str(name)] = counts.get(str(name), 0) + int(value)
    return counts


def keys_without_ttl(nodes: list[redis.Redis], prefix: str) -> int:
    return sum(client.ttl(key) == -1 for client in nodes for key in client.scan_iter(match=f"{prefix}:*", count=1000))


def run_session(kind: str, mode: str, faults: list[Fault], keys: dict[int, list[str]], ledger_url: str,
                work: Path) -> tuple[list[RowResult], dict[str, object]]:
    """Every fault of `faults` against a fresh store of `kind` in fail mode `mode`; the rows and the
    session's facts (server version, keys without a TTL)."""
    store = start_store(kind)
    prefix = f"faults-{kind}-{mode}-{os.urandom(3).hex()}"
    ledger = redis.Redis.from_url(ledger_url, decode_responses=True)
    ledger.delete(LEDGER_KEY)
    apps = AppServers(environment(work, store.url, ledger_url, prefix, mode), work / f"{kind}-{mode}.log")
    rows: list[RowResult] = []
    try:
        apps.start()
        for index, fault in enumerate(faults):
            context = Context(store, apps, prefix, keys[index])
            rows.append(run_row(kind, mode, fault, context, ledger))
            print(f"faults: {kind} {mode} {fault.name}: {rows[-1]}", flush=True)
        time.sleep(LEASE + 1.0)
        port = dict(apps.urls)["gunicorn"]
        for index, row in enumerate(rows):
            row.slots_leaked = held_slots(port, keys[index])
        apps.stop()
        counts = _metric_counts(store.nodes(), prefix)
        for index, row in enumerate(rows):
            row.metrics = {"allowed": counts.get(f"tier:row{index}:allowed", 0) - row.served - row.held_served,
                           "blocked": counts.get(f"tier:row{index}:blocked", 0) - row.refused_429 - row.refused_503}
        facts = {"version": store.version, "keys_without_ttl": keys_without_ttl(store.nodes(), prefix)}
    finally:
        apps.stop()
        store.stop()
        ledger.close()
    return rows, facts
