"""ratelimit_app.service.events: the one interface through which the limiter feeds observability. Reports
reach whatever recorder is installed, with every argument; with none installed they are dropped."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ratelimit_app import Policy
from ratelimit_app.observability import recorder as app_recorder
from ratelimit_app.service import events
from ratelimit_app.service.guard import RedisGuard
from ratelimit_app.service.limiter import LimiterService


class Collected:
    """A recorder that keeps each report: (method name, keyword arguments)."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, dict[str, Any]]] = []

    def record_decision(self, **kwargs: Any) -> None:
        self.reports.append(("record_decision", kwargs))

    def record_shadow_blocked(self, **kwargs: Any) -> None:
        self.reports.append(("record_shadow_blocked", kwargs))

    def record_usage(self, **kwargs: Any) -> None:
        self.reports.append(("record_usage", kwargs))

    def observe_latency(self, seconds: float) -> None:
        self.reports.append(("observe_latency", {"seconds": seconds}))

    def record_breaker_change(self, **kwargs: Any) -> None:
        self.reports.append(("record_breaker_change", kwargs))


@pytest.fixture
def collected() -> Iterator[Collected]:
    installed = events._recorder
    recorder = Collected()
    events.install(recorder)
    yield recorder
    events.install(installed)


def test_the_app_installs_its_metrics_recorder_when_it_is_ready() -> None:
    assert events._recorder is app_recorder


def test_each_report_reaches_the_installed_recorder_with_every_argument(collected: Collected) -> None:
    events.record_decision(allowed=False, tier="free", policy="burst", degraded=True, identity="key:abcd1234")
    events.record_decision(allowed=True, tier="list", policy=None, degraded=False, identity="ip:192.0.2.1",
                           unauthorized=True, listed="allow")
    events.record_shadow_blocked(tier="pro", policies=("minute", "day"), identity="user:7")
    events.record_usage(tier="pro", used=(("llm.tokens", "tokens", 100),))
    events.observe_latency(0.0025)
    events.record_breaker_change(previous="closed", state="open")
    assert collected.reports == [
        ("record_decision", {"allowed": False, "tier": "free", "policy": "burst", "degraded": True,
                             "identity": "key:abcd1234", "unauthorized": False, "listed": ""}),
        ("record_decision", {"allowed": True, "tier": "list", "policy": None, "degraded": False,
                             "identity": "ip:192.0.2.1", "unauthorized": True, "listed": "allow"}),
        ("record_shadow_blocked", {"tier": "pro", "policies": ("minute", "day"), "identity": "user:7"}),
        ("record_usage", {"tier": "pro", "used": (("llm.tokens", "tokens", 100),)}),
        ("observe_latency", {"seconds": 0.0025}),
        ("record_breaker_change", {"previous": "closed", "state": "open"}),
    ]


def test_without_a_recorder_every_report_is_dropped_quietly(collected: Collected) -> None:
    events.install(None)
    events.record_decision(allowed=True, tier="free", policy=None, degraded=False, identity="ip:192.0.2.1")
    events.record_shadow_blocked(tier="free", policies=("minute",), identity="ip:192.0.2.1")
    events.record_usage(tier="free", used=(("tokens", "tokens", 1),))
    events.observe_latency(0.001)
    events.record_breaker_change(previous="closed", state="open")
    assert collected.reports == []


def test_the_limiter_service_reports_through_it(collected: Collected) -> None:
    """A decision Redis answered reports its latency; a breaker that opens reports the change."""
    service = LimiterService(guard=RedisGuard(breaker=None))
    service.hit("client", [Policy("minute", "fixed_window", limit=5, period=60)])
    [(name, latency)] = collected.reports
    assert name == "observe_latency" and 0 < latency["seconds"] < 5
    breaker = service.guard.breaker
    for _ in range(breaker.failures):
        breaker.record_failure("down")
    assert collected.reports[-1] == ("record_breaker_change", {"previous": "closed", "state": "open"})
