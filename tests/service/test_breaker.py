"""ratelimit_app.service.breaker: `CircuitBreaker`'s states on an injected clock. When it opens, how long it
skips Redis, the one probe, how the cool-down grows and shrinks, probes that never report or end without
asking Redis, and what each change reports."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from ratelimit_app.service.breaker import CALL, CLOSED, HALF_OPEN, OPEN, PROBE, SKIP, CircuitBreaker


class Clock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Changes(list[tuple[str, dict[str, Any]]]):
    def __call__(self, state: str, detail: dict[str, Any]) -> None:
        self.append((state, detail))


def breaker(failures: int = 3, cooldown: float = 1.0, max_cooldown: float = 5.0) -> tuple[CircuitBreaker, Clock,
                                                                                          Changes]:
    clock, changes = Clock(), Changes()
    return CircuitBreaker(failures, cooldown, max_cooldown, clock=clock, on_change=changes), clock, changes


@pytest.mark.parametrize(("failures", "cooldown", "max_cooldown", "message"), [
    (0, 1.0, 5.0, "failures"), (3, 0.0, 5.0, "cooldown"), (3, -1.0, 5.0, "cooldown"), (3, 2.0, 1.0, "max_cooldown"),
])
def test_settings_that_cannot_work_are_refused(failures: int, cooldown: float, max_cooldown: float,
                                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CircuitBreaker(failures, cooldown, max_cooldown)


def test_it_opens_after_exactly_the_consecutive_failures_and_a_success_starts_the_count_again() -> None:
    cb, _, changes = breaker(failures=3)
    cb.record_failure("e1")
    cb.record_failure("e2")
    cb.record_success()
    cb.record_failure("e3")
    cb.record_failure("e4")
    assert cb.state == CLOSED and cb.before_call() == CALL and changes == []
    try:
        raise ConnectionRefusedError("e5")
    except ConnectionRefusedError as cause:
        error = RuntimeError("Redis did not answer")
        error.__cause__ = cause
    cb.record_failure(error)
    assert cb.state == OPEN and cb.before_call() == SKIP
    assert changes == [(OPEN, {"previous": CLOSED, "failures": 3, "error": "Redis did not answer",
                               "error_class": "ConnectionRefusedError", "next_probe_seconds": 1.0})]


def test_open_it_skips_until_the_cooldown_has_passed_then_lets_one_probe_through() -> None:
    cb, clock, changes = breaker(failures=1, cooldown=2.0)
    cb.record_failure("down")
    clock.now += 1.999
    assert cb.before_call() == SKIP and cb.retry_in() == pytest.approx(0.001)
    clock.now += 0.001
    assert cb.before_call() == PROBE
    assert cb.state == HALF_OPEN and cb.retry_in() == 0.0
    assert [cb.before_call() for _ in range(5)] == [SKIP] * 5  # one probe at a time
    assert changes[-1] == (HALF_OPEN, {"previous": OPEN})


def test_among_racing_threads_exactly_one_gets_the_probe() -> None:
    cb, clock, _ = breaker(failures=1)
    cb.record_failure("down")
    clock.now += 1.0
    start = threading.Barrier(32)
    steps: list[int] = []

    def call() -> None:
        start.wait()
        steps.append(cb.before_call())

    threads = [threading.Thread(target=call) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(steps) == [PROBE] + [SKIP] * 31


def test_a_failed_probe_doubles_the_cooldown_up_to_its_maximum_and_a_success_brings_it_back() -> None:
    cb, clock, changes = breaker(failures=1, cooldown=1.0, max_cooldown=3.0)
    cb.record_failure("down")
    cooldowns = []
    for _ in range(3):
        clock.now += cb.retry_in()
        assert cb.before_call() == PROBE
        cb.record_failure("still down", probe=True)
        cooldowns.append(cb.snapshot().cooldown)
    assert cooldowns == [2.0, 3.0, 3.0]
    assert changes[-1][1]["previous"] == HALF_OPEN and changes[-1][1]["next_probe_seconds"] == 3.0
    clock.now += 3.0
    assert cb.before_call() == PROBE
    cb.record_success(probe=True)
    assert (cb.state, cb.snapshot().cooldown) == (CLOSED, 1.0)
    assert changes[-1] == (CLOSED, {"previous": HALF_OPEN, "outage_seconds": 9.0})
    assert cb.snapshot().opened == 1  # re-opening after a failed probe is the same outage


def test_a_failure_of_a_call_that_started_before_the_breaker_opened_changes_nothing() -> None:
    cb, clock, changes = breaker(failures=1)
    cb.record_failure("down")
    clock.now += 0.5
    cb.record_failure("late report of an earlier call")
    assert (len(changes), cb.retry_in()) == (1, 0.5)
    clock.now += 0.5
    assert cb.before_call() == PROBE
    cb.record_failure("a call that was not the probe")  # probe=False: the probe's own report decides
    assert cb.state == HALF_OPEN and len(changes) == 2


def test_a_probe_that_never_reports_back_does_not_hold_the_breaker_half_open_forever() -> None:
    cb, clock, _ = breaker(failures=1, cooldown=1.0, max_cooldown=5.0)
    cb.record_failure("down")
    clock.now += 1.0
    assert cb.before_call() == PROBE  # and its caller dies
    clock.now += 4.999
    assert cb.before_call() == SKIP
    clock.now += 0.001
    assert cb.before_call() == PROBE


def test_a_probe_abandoned_without_asking_redis_lets_the_next_caller_probe_at_once() -> None:
    cb, clock, _ = breaker(failures=1)
    cb.record_failure("down")
    clock.now += 1.0
    assert cb.before_call() == PROBE
    cb.abandon_probe()
    assert cb.state == OPEN and cb.retry_in() == 0.0
    assert cb.before_call() == PROBE
    cb.abandon_probe()
    cb.record_success()  # a success from any call closes it
    cb.abandon_probe()  # closed: nothing to abandon
    assert cb.state == CLOSED and cb.before_call() == CALL


def test_snapshot_reports_failures_cooldown_retry_and_openings() -> None:
    cb, clock, _ = breaker(failures=2, cooldown=1.5)
    cb.record_failure("e")
    snap = cb.snapshot()
    assert (snap.state, snap.consecutive_failures, snap.cooldown, snap.retry_in, snap.opened) == \
        (CLOSED, 1, 1.5, 0.0, 0)
    cb.record_failure("e")
    clock.now += 0.5
    snap = cb.snapshot()
    assert (snap.state, snap.consecutive_failures, snap.retry_in, snap.opened) == (OPEN, 2, 1.0, 1)
    clock.now += 1.0
    cb.before_call()
    cb.record_success(probe=True)
    cb.record_failure("e")
    cb.record_failure("e")
    assert cb.snapshot().opened == 2


def test_the_error_reported_is_cut_to_200_characters() -> None:
    cb, _, changes = breaker(failures=1)
    cb.record_failure("x" * 1000)
    assert changes[0][1]["error"] == "x" * 200


def test_without_a_listener_each_change_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    clock = Clock()
    cb = CircuitBreaker(1, 1.0, 2.0, clock=clock)
    cb.record_failure("refused")
    cb.record_failure("refused")
    clock.now += 1.0
    cb.before_call()
    cb.record_success(probe=True)
    logged = [(r.levelname, r.ratelimit["state"], r.ratelimit["previous"])  # type: ignore[attr-defined]
              for r in caplog.records if getattr(r, "ratelimit_event", "") == "ratelimit.breaker"]
    assert logged == [("WARNING", OPEN, CLOSED), ("INFO", HALF_OPEN, OPEN), ("INFO", CLOSED, HALF_OPEN)]
