"""The fault harness's own parts (bench/faults): its proxy's faults against a real Redis, and the rules by
which a row is measured and judged. The harness itself runs in .ci/run (`python -m bench.faults.run --short`)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from bench.faults.load import Sent
from bench.faults.measure import Timeline, exact_after, identity_of, measure_row, parse_ledger
from bench.faults.proxy import FaultProxy
from bench.faults.report import row_problems, violations
from bench.faults.stores import ClusterStore
from bench.faults.tiers import LIMIT, WINDOW

KEYS = ["aaaa1111.secret", "bbbb2222.secret"]


def test_the_proxy_delays_loses_and_resets_replies(server: Any) -> None:
    proxy = FaultProxy("127.0.0.1", server.port)
    client = redis.Redis(port=proxy.port, socket_timeout=2)
    try:
        assert client.ping()
        proxy.mode, proxy.delay = "delay", 0.3
        started = time.monotonic()
        assert client.ping() and time.monotonic() - started >= 0.3
        proxy.mode, proxy.loss, proxy.loss_pause = "loss", 1.0, 0.3
        started = time.monotonic()
        assert client.ping() and time.monotonic() - started >= 0.3
        proxy.mode, proxy.resets = "reset", 1.0
        with pytest.raises(redis.ConnectionError):
            redis.Redis(port=proxy.port, socket_timeout=2).ping()
        proxy.mode = "forward"
        assert redis.Redis(port=proxy.port, socket_timeout=2).ping()
    finally:
        client.close()
        proxy.close()


def ledger_of(counts: dict[tuple[int, int], tuple[int, int]]) -> dict[str, str]:
    """{(key index, window): (served by the store, degraded)} as the view writes it."""
    raw = {}
    for (key, window), (store, degraded) in counts.items():
        raw[f"{identity_of(KEYS[key])}|{window}|0"] = str(store)
        raw[f"{identity_of(KEYS[key])}|{window}|1"] = str(degraded)
    return raw


def test_over_admission_is_counted_per_window_and_key() -> None:
    ledger = parse_ledger(ledger_of({(0, 100): (LIMIT, 0), (0, 101): (LIMIT, 3), (1, 100): (LIMIT + 1, 0)}))
    times = Timeline(100 * WINDOW, 100 * WINDOW + 0.5, 100 * WINDOW + 1, 102 * WINDOW)
    row = measure_row("redis", "open", "stop-1s", KEYS, [], ledger, times)
    assert (row.over_max, row.over_total) == (3, 4)


def test_exact_again_counts_from_the_heal_to_the_first_window_that_stays_exact() -> None:
    exact, degraded = (LIMIT, 0), (4, 8)
    windows = {100: exact, 101: degraded, 102: degraded, 103: exact, 104: exact, 105: exact}
    ledger = parse_ledger(ledger_of({(key, w): counts for key in (0, 1) for w, counts in windows.items()}))
    times = Timeline(99.5 * WINDOW, 101 * WINDOW, 101.5 * WINDOW, 106.5 * WINDOW)
    assert exact_after(KEYS, ledger, [], times) == pytest.approx(1.5 * WINDOW)
    # a 503 in a window makes it inexact, even with the right count served
    refused = [Sent(0, "gunicorn", 103.2 * WINDOW, 103.2 * WINDOW, 503, True)]
    assert exact_after(KEYS, ledger, refused, times) == pytest.approx(2.5 * WINDOW)
    # the last window inexact: not exact again within the row
    windows[105] = degraded
    ledger = parse_ledger(ledger_of({(key, w): counts for key in (0, 1) for w, counts in windows.items()}))
    assert exact_after(KEYS, ledger, [], times) is None


def test_a_row_fails_on_a_5xx_a_leaked_slot_or_a_count_lost_or_duplicated() -> None:
    ledger = parse_ledger({})
    times = Timeline(0, 1, 2, 3)
    records = [Sent(0, "uvicorn", 1.0, 1.1, 500, False), Sent(0, "uvicorn", 1.0, 1.1, 503, True)]
    row = measure_row("redis", "closed", "resets", KEYS, records, ledger, times)
    assert (row.errors_5xx, row.refused_503) == (1, 1)
    assert row_problems(row) == ["1 5xx"]
    row.errors_5xx, row.slots_leaked, row.metrics = 0, 2, {"allowed": 3, "blocked": -1}
    assert row_problems(row) == ["2 slots held past their lease",
                                 "metrics: 3 allowed counted more than once (duplicated)", "metrics: 1 blocked lost"]
    # counts lost with the store's (or a killed worker's) memory are the fault's, not a failure; duplicates are
    row.slots_leaked, row.metrics_lost_with = 0, "store"
    assert row_problems(row) == ["metrics: 3 allowed counted more than once (duplicated)"]
    assert violations([row], {"redis/closed": {"keys_without_ttl": 2}}) == [
        "redis closed resets: metrics: 3 allowed counted more than once (duplicated)",
        "redis/closed: 2 keys without a TTL"]


def test_resharding_moves_each_slot_of_the_run_once_keeping_values_and_ttls() -> None:
    store = ClusterStore()
    try:
        client = store.topology.client()
        keys = [f"run:{{identity{n}}}:k" for n in range(12)]
        for value, key in enumerate(keys):
            client.set(key, value, ex=100)
        slots = [client.keyslot(key) for key in keys]
        before = [client.nodes_manager.get_node_from_slot(slot).port for slot in slots]
        assert store.reshard("run") == len(set(slots))
        after_client = store.topology.client()
        after = [after_client.nodes_manager.get_node_from_slot(slot).port for slot in slots]
        assert all(old != new for old, new in zip(before, after, strict=True))  # each moved, none around the ring
        assert [after_client.get(key) for key in keys] == [str(value).encode() for value in range(len(keys))]
        assert all(0 < after_client.ttl(key) <= 100 for key in keys)
    finally:
        store.stop()
