"""ratelimit_app.apply.shedding: priorities (declared, by the longest path prefix, else normal), the fleet
count's thresholds and check, the process shedder's count of requests in flight, and the episode log
(started once, ended once after EPISODE_QUIET seconds without a shed)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from django.test import RequestFactory

from ratelimit_app.apply import shedding
from ratelimit_app.apply.shedding import (
    CRITICAL,
    EPISODE_QUIET,
    FLEET_IDENTITY,
    FLEET_POLICY,
    LOW,
    NORMAL,
    OWNER_PREFIX,
    Departure,
    InFlight,
    fleet_check,
    priority_of_owner,
    process_sheds,
    shed_config,
    validate_priority,
)
from ratelimit_app.core.policies import CONCURRENCY, MAX_LIMIT

factory = RequestFactory()


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


def test_validate_priority_names_the_choices() -> None:
    assert [validate_priority(p) for p in (CRITICAL, NORMAL, LOW)] == ["critical", "normal", "low"]
    with pytest.raises(ValueError, match="priority: 'urgent' must be one of critical, normal, low"):
        validate_priority("urgent")


def test_a_declared_priority_wins_then_the_longest_prefix_then_normal(settings: Any) -> None:
    use(settings, SHED_PRIORITIES={"/api/": "low", "/api/checkout": "critical", "/api/checkout/preview": "low"})
    priority = shed_config().priority_for
    assert priority("/api/checkout/pay", None) == CRITICAL
    assert priority("/api/checkout/preview/1", None) == LOW
    assert priority("/api/users", None) == LOW
    assert priority("/health", None) == NORMAL
    assert priority("/api/users", CRITICAL) == CRITICAL


def test_a_prefix_matches_by_segment_and_a_path_read_two_ways_gets_the_lower_priority(settings: Any) -> None:
    use(settings, SHED_PRIORITIES={"/checkout": "critical", "/export/": "low", "/search": "normal",
                                   "/search/": "low"})  # one prefix written twice: the lower wins
    priority = shed_config().priority_for
    assert priority("/checkout", None) == priority("/checkout/pay", None) == CRITICAL
    assert priority("/checkoutx", None) == NORMAL and priority("/export", None) == LOW
    assert priority("/checkout/../export/x", None) == priority("/export/x", None) == LOW
    assert priority("/export/../checkout/x", None) == LOW  # as sent, it is under /export
    assert priority("/checkout//x", None) == CRITICAL and priority("/search/x", None) == LOW
    assert priority("/export/../checkout/x", CRITICAL) == CRITICAL  # the resolved view's declaration wins


def test_thresholds_are_shares_of_the_capacity_and_critical_is_never_refused(settings: Any) -> None:
    use(settings, SHED_CAPACITY=10, SHED_LOW_AT=0.55, SHED_NORMAL_AT=0.99, SHED_LEASE=45)
    thresholds = shed_config().thresholds
    assert {p: t.limit for p, t in thresholds.items()} == {LOW: 5, NORMAL: 9, CRITICAL: MAX_LIMIT}
    assert {(t.name, t.algorithm, t.period) for t in thresholds.values()} == {(FLEET_POLICY, CONCURRENCY, 45)}
    use(settings, SHED_CAPACITY=1, SHED_LOW_AT=0.1)
    assert shed_config().thresholds[LOW].limit == 1  # never below one request


def test_the_fleet_check_is_the_one_fleet_identity_at_the_requests_priority(settings: Any) -> None:
    asked: list[str] = []

    def declared(request: Any) -> str | None:
        asked.append(request.path)
        return None

    use(settings, SHED_CAPACITY=None)
    assert fleet_check(factory.get("/api/users"), declared) is None and asked == []  # off: nothing asked
    use(settings, SHED_CAPACITY=20, SHED_PRIORITIES={"/api/export": "low"})
    check = fleet_check(factory.get("/api/export"), declared)
    assert check is not None and asked == ["/api/export"]
    assert (check.identity, check.owner, check.policies) == (FLEET_IDENTITY, "shed.low",
                                                              (shed_config().thresholds[LOW],))
    critical = fleet_check(factory.get("/api/export"), lambda request: CRITICAL)
    assert critical is not None and critical.owner == OWNER_PREFIX + CRITICAL
    # a gateway's request describes another one: the described path's prefix decides, nothing is declared
    described = fleet_check(factory.get("/auth"), lambda request: CRITICAL, "/api/export/all")
    assert described is not None and described.owner == "shed.low"
    assert fleet_check(factory.get("/api/export"), declared, "/other") is not None and asked == ["/api/export"]


def test_priority_of_owner_reads_only_fleet_owners() -> None:
    assert [priority_of_owner(OWNER_PREFIX + p) for p in (LOW, NORMAL, CRITICAL)] == [LOW, NORMAL, CRITICAL]
    assert priority_of_owner("") is None and priority_of_owner("throttle:x.Y") is None


def test_the_process_shedder_refuses_low_priority_requests_over_its_limit_only(settings: Any) -> None:
    use(settings, SHED_PROCESS_LIMIT=3)
    config = shed_config()
    assert not process_sheds(config, LOW, 3) and process_sheds(config, LOW, 4)
    assert not process_sheds(config, NORMAL, 100) and not process_sheds(config, CRITICAL, 100)
    use(settings, SHED_PROCESS_LIMIT=None)
    assert not process_sheds(shed_config(), LOW, 10**6)


def test_in_flight_counts_exactly_under_threads_and_a_departure_leaves_once(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = InFlight()
    monkeypatch.setattr(shedding, "in_flight", counter)
    start = threading.Barrier(16)
    departures: list[Departure] = []
    lock = threading.Lock()

    def request() -> None:
        start.wait()
        for _ in range(200):
            counter.enter()
            departure = Departure()
            with lock:
                departures.append(departure)

    threads = [threading.Thread(target=request) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.count == 3200
    for departure in departures:  # closed, dropped and raised: each one leaves once however often it is called
        departure()
        departure()
    assert counter.count == 0


def test_an_episode_is_logged_once_when_it_starts_and_once_when_it_has_been_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    episode = shedding._Episode("fleet")
    episode.record_admitted()  # nothing shed yet: nothing to end
    for _ in range(5):
        episode.record_shed(LOW, {"identity": "key:abcd1234"})
    episode.record_admitted()  # within EPISODE_QUIET of the last shed: still on
    assert episode.active and episode.shed == 5
    episode.last_shed = time.monotonic() - EPISODE_QUIET
    episode.record_admitted()
    episode.record_admitted()
    logged = [(r.levelname, r.ratelimit) for r in caplog.records  # type: ignore[attr-defined]
              if getattr(r, "ratelimit_event", "").startswith("ratelimit.shed_")]
    assert logged == [("WARNING", {"shedder": "fleet", "priority": "low", "identity": "key:abcd1234"}),
                      ("INFO", {"shedder": "fleet", "shed": 5})]
    assert not episode.active and episode.shed == 0
    episode.record_shed(NORMAL, {})
    assert episode.active and episode.shed == 1  # a new episode
