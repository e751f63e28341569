"""GET /metrics: Prometheus text from a dedicated registry, counting exactly what was decided."""

from __future__ import annotations

import time
from typing import Any

import prometheus_client
import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from devtools.embedded import free_port
from ratelimit_app.models import ApiKey, Tier
from ratelimit_app.observability.recorder import flush, observe_latency, record_decision
from ratelimit_app.service.breaker import PROBE
from ratelimit_app.service.limiter import get_limiter
from tests.support.limits_support import make_key, seed_tiers

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: Client) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == prometheus_client.CONTENT_TYPE_LATEST
    samples: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_decisions_by_tier_policy_and_outcome(client: Client) -> None:
    before = scrape(client)
    for _ in range(7):
        record_decision(allowed=True, tier="pro", policy=None, degraded=False, identity="key:abcdefgh")
    for _ in range(3):
        record_decision(allowed=False, tier="pro", policy="minute", degraded=False, identity="key:abcdefgh")
    record_decision(allowed=False, tier="ip", policy="ip", degraded=False, identity="ip:192.0.2.4")
    after = scrape(client)

    def delta(**labels: str) -> float:
        name = "ratelimit_decisions_total"
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta(tier="pro", policy="none", outcome="allowed") == 7
    assert delta(tier="pro", policy="minute", outcome="blocked") == 3
    assert delta(tier="ip", policy="ip", outcome="blocked") == 1


def test_degraded_decisions_are_a_series_of_their_own(client: Client) -> None:
    before = scrape(client)
    for _ in range(4):
        record_decision(allowed=True, tier="free", policy=None, degraded=True, identity="ip:192.0.2.5")
    record_decision(allowed=False, tier="free", policy="", degraded=True, identity="ip:192.0.2.5")
    after = scrape(client)
    name = "ratelimit_degraded_decisions_total"
    assert value(after, name, tier="free", outcome="allowed") - value(before, name, tier="free", outcome="allowed") == 4
    assert value(after, name, tier="free", outcome="blocked") - value(before, name, tier="free", outcome="blocked") == 1


def test_latency_histogram_buckets_are_cumulative(client: Client) -> None:
    before = scrape(client)
    for seconds in (0.0004, 0.002, 0.002, 0.04, 3.0):
        observe_latency(seconds)
    observe_latency(-1.0)  # ignored
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("ratelimit_limiter_latency_seconds_bucket", le="0.0005") == 1
    assert delta("ratelimit_limiter_latency_seconds_bucket", le="0.0025") == 3
    assert delta("ratelimit_limiter_latency_seconds_bucket", le="0.05") == 4
    assert delta("ratelimit_limiter_latency_seconds_bucket", le="2.5") == 4
    assert delta("ratelimit_limiter_latency_seconds_bucket", le="+Inf") == 5
    assert delta("ratelimit_limiter_latency_seconds_count") == 5
    assert delta("ratelimit_limiter_latency_seconds_sum") == pytest.approx(3.0444)


def test_breaker_state_and_transitions(client: Client, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "BREAKER_FAILURES": 1, "BREAKER_COOLDOWN": 0.05,
                          "BREAKER_MAX_COOLDOWN": 0.05}
    breaker = get_limiter().guard.breaker  # the gauge reads the service's own breaker
    before = scrape(client)
    breaker.record_failure("Redis down")
    samples = scrape(client)
    assert [value(samples, "ratelimit_breaker_state", state=s) for s in ("closed", "open", "half_open")] == \
        [0, 1, 0]
    time.sleep(breaker.retry_in())
    assert breaker.before_call() == PROBE
    breaker.record_success(probe=True)
    after = scrape(client)
    assert value(after, "ratelimit_breaker_state", state="closed") == 1
    for state in ("open", "half_open", "closed"):
        name = "ratelimit_breaker_transitions_total"
        assert value(after, name, state=state) - value(before, name, state=state) == 1


def test_flush_health_is_exposed(client: Client, settings: Any) -> None:
    record_decision(allowed=True, tier="free", policy=None, degraded=False, identity="ip:192.0.2.6")
    assert flush()
    samples = scrape(client)
    assert value(samples, "ratelimit_metrics_pending") == 0
    assert value(samples, "ratelimit_metrics_flushes_total", result="ok") >= 1
    errors = value(samples, "ratelimit_metrics_flushes_total", result="error")

    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    record_decision(allowed=True, tier="free", policy=None, degraded=False, identity="ip:192.0.2.6")
    assert not flush()
    samples = scrape(client)
    assert value(samples, "ratelimit_metrics_pending") >= 1
    assert value(samples, "ratelimit_metrics_flushes_total", result="error") >= errors + 1


@pytest.mark.django_db
def test_real_requests_through_the_middleware_are_counted(client: Client) -> None:
    _, key = ApiKey.objects.create_key(name="prom", tier=Tier.objects.get(slug="free"))
    before = scrape(client)
    statuses = [client.get("/api/users", HTTP_X_API_KEY=key).status_code for _ in range(13)]
    assert statuses == [200] * 10 + [429] * 3
    after = scrape(client)
    name = "ratelimit_decisions_total"
    assert value(after, name, tier="free", policy="none", outcome="allowed") - \
        value(before, name, tier="free", policy="none", outcome="allowed") == 10
    assert value(after, name, tier="free", policy="burst", outcome="blocked") - \
        value(before, name, tier="free", policy="burst", outcome="blocked") == 3


@pytest.mark.django_db
def test_a_redis_outage_shows_as_degraded_decisions_and_an_open_breaker(client: Client, settings: Any) -> None:
    _, key = ApiKey.objects.create_key(name="outage", tier=Tier.objects.get(slug="free"))
    assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200  # warms the key lookup cache
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                          "FAIL_MODE": "open", "BREAKER_FAILURES": 2, "BREAKER_COOLDOWN": 30.0}
    before = scrape(client)
    statuses = [client.get("/api/users", HTTP_X_API_KEY=key).status_code for _ in range(5)]
    after = scrape(client)
    assert statuses == [200] * 5  # fail mode "open": served, marked degraded
    name = "ratelimit_degraded_decisions_total"
    assert value(after, name, tier="free", outcome="allowed") - value(before, name, tier="free", outcome="allowed") == 5
    assert value(after, "ratelimit_breaker_state", state="open") == 1
    assert value(after, "ratelimit_breaker_transitions_total", state="open") - \
        value(before, "ratelimit_breaker_transitions_total", state="open") == 1
    # the failed Redis calls were timed too (2 failures open the breaker; then Redis is skipped)
    assert value(after, "ratelimit_limiter_latency_seconds_count") - \
        value(before, "ratelimit_limiter_latency_seconds_count") == 2
    # settings change: a new limiter service with a closed breaker, and the gauge follows
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "closed"}
    assert value(scrape(client), "ratelimit_breaker_state", state="closed") == 1


def test_a_dedicated_registry_serves_only_the_limiter_series(client: Client) -> None:
    names = {name for name, _ in scrape(client)}
    assert names and all(name.startswith("ratelimit_") for name in names)
    global_names = {m.name for m in prometheus_client.REGISTRY.collect()}
    assert not any(name.startswith("ratelimit_") for name in global_names)


def test_only_get_is_served(client: Client) -> None:
    assert client.post("/metrics").status_code == 405
    assert client.get("/metrics")["Cache-Control"] == "no-store"



@pytest.mark.django_db
def test_settled_usage_is_counted_in_units_per_tier_and_policy(client: Client) -> None:
    seed_tiers()
    key = make_key("pro")
    series = {"tier": "pro", "policy": "llm.tokens", "unit": "tokens"}
    before = value(scrape(client), "ratelimit_usage_units_total", **series)
    response = client.post("/api/llm/chat", b'{"max_tokens": 500, "use": 100}', content_type="application/json",
                           HTTP_X_API_KEY=key)
    assert response.status_code == 200
    b"".join(response.streaming_content)  # type: ignore[attr-defined]
    response.close()
    response.close()  # settled once, however often it is closed
    assert value(scrape(client), "ratelimit_usage_units_total", **series) - before == 100
    refused = client.post("/api/llm/chat", b'{"max_tokens": 1950, "use": 100}', content_type="application/json",
                          HTTP_X_API_KEY=key)
    assert refused.status_code == 429  # refused: nothing reserved, nothing used
    assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200  # no usage limit on this route
    assert value(scrape(client), "ratelimit_usage_units_total", **series) - before == 100
