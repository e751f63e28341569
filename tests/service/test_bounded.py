"""Blocking calls a caller waits for no longer than its time: a late call is left to finish on its thread,
and while it is overdue no other call starts (a hung server costs one wait, then none)."""

from __future__ import annotations

import threading
import time

import pytest

from ratelimit_app.service import bounded
from ratelimit_app.service.bounded import BoundedCalls, Unavailable


def test_a_call_that_answers_in_time_returns_its_value_or_raises_its_error() -> None:
    calls = BoundedCalls()
    assert calls.call(lambda: 42, 5) == 42
    with pytest.raises(KeyError):
        calls.call(lambda: dict[str, int]()["missing"], 5)
    assert calls.overdue == 0


def test_an_overdue_call_makes_the_next_ones_skip_at_once_until_it_ends() -> None:
    calls = BoundedCalls()
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(Unavailable):
        calls.call(lambda: release.wait(10), 0.1)
    assert 0.1 <= time.monotonic() - started < 1
    assert calls.overdue == 1
    skipped = time.monotonic()
    with pytest.raises(Unavailable, match="earlier call"):
        calls.call(lambda: "never run", 5)
    assert time.monotonic() - skipped < 0.05
    release.set()  # the hung call ends: calls run again
    deadline = time.monotonic() + 10
    while calls.overdue and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls.call(lambda: "answered", 5) == "answered"


def test_calls_beyond_the_threads_are_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "MAX_THREADS", 2)
    calls = BoundedCalls()
    release = threading.Event()
    waiting = [threading.Thread(target=lambda: calls.call(lambda: release.wait(10), 10)) for _ in range(2)]
    for thread in waiting:
        thread.start()
    deadline = time.monotonic() + 10
    while calls._running < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(Unavailable, match="busy"):
        calls.call(lambda: "never run", 5)
    release.set()
    for thread in waiting:
        thread.join(10)
    assert calls.call(lambda: "answered", 5) == "answered"
