"""IsolatedRateLimit (the `ratelimit` fixture's object) against the real Redis and the demo site: each test's
state is its own and gone afterwards, `advance` moves the limiter's clock (a calendar month included),
`reset` forgets, `disable`/`enable` switch every limit."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, override_settings

from ratelimit_app.conf import settings as conf
from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.models import Tier, TierLimit
from ratelimit_app.service import clock
from ratelimit_app.service.limiter import get_limiter
from ratelimit_app.testing import IsolatedRateLimit, assert_limited, assert_not_limited, make_api_key
from tests.support.limits_support import LimitSpec, make_tier

pytestmark = pytest.mark.django_db

HOURLY: list[LimitSpec] = [("hour", "sliding_window", 2, 3600, None, "")]


def keys_under(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}:*", count=1000))


def get(client: Client, key: str, path: str = "/api/users") -> Any:
    return client.get(path, HTTP_X_API_KEY=key)


def test_each_test_counts_under_a_prefix_of_its_own_and_leaves_no_key(client: Client,
                                                                       redis_client: redis.Redis) -> None:
    make_tier("hourly", HOURLY)
    key = make_api_key("hourly")
    outer_prefix = ratelimit_settings.KEY_PREFIX
    generation = "{}:lookups:generation"  # the lookups shared through the Django cache (django-redis here)
    with IsolatedRateLimit() as first:
        assert ratelimit_settings.KEY_PREFIX == first.prefix != outer_prefix
        assert [get(client, key).status_code for _ in range(3)] == [200, 200, 429]
        assert keys_under(redis_client, first.prefix)
        assert caches["default"].get(generation.format(first.prefix)) is not None
    assert keys_under(redis_client, first.prefix) == []  # the counters and the metrics, flushed then deleted
    assert caches["default"].get(generation.format(first.prefix)) is None
    assert ratelimit_settings.KEY_PREFIX == outer_prefix
    with IsolatedRateLimit() as second:
        assert second.prefix != first.prefix
        assert_not_limited(get(client, key))  # nothing of the first test is seen


def test_the_prefix_holds_however_the_test_changes_ratelimit(client: Client, settings: Any,
                                                            ratelimit: IsolatedRateLimit) -> None:
    settings.RATELIMIT = {"REDIS_URL": settings.RATELIMIT["REDIS_URL"], "IP_RATE": "2/h"}  # a new dict: no prefix
    with override_settings(RATELIMIT={**settings.RATELIMIT, "KEY_PREFIX": "someone-elses"}):
        assert ratelimit_settings.KEY_PREFIX == ratelimit.prefix
        # no key, and no REQUIRE_API_KEY in the new dict: served, and charged to the per-IP limit
        assert [client.get("/api/users").status_code for _ in range(3)] == [200, 200, 429]
    assert ratelimit_settings.IP_RATE == "2/h" and ratelimit_settings.KEY_PREFIX == ratelimit.prefix


def test_advance_moves_the_clock_of_this_test_without_waiting(client: Client, ratelimit: IsolatedRateLimit) -> None:
    make_tier("hourly", HOURLY)
    key = make_api_key("hourly")
    assert [get(client, key).status_code for _ in range(2)] == [200, 200]
    refused = get(client, key)
    assert_limited(refused, policy="hour")
    wait = refused.json()["retry_after"]
    assert 3500 < wait <= 3600
    ratelimit.advance(wait - 60)  # (a minute of slack for the real time the test takes)
    assert_limited(get(client, key), policy="hour")
    ratelimit.advance(60)
    assert ratelimit.offset == pytest.approx(wait, abs=0.002)
    assert_not_limited(get(client, key))


def test_a_monthly_quota_starts_afresh_once_advance_crosses_the_month(client: Client,
                                                                     ratelimit: IsolatedRateLimit) -> None:
    tier = Tier.objects.create(slug="monthly", name="Monthly", time_zone="Europe/Paris")
    quota = TierLimit(tier=tier, name="month", algorithm="fixed_window", limit=2, period=1, calendar="month")
    quota.full_clean()
    quota.save()
    key = make_api_key("monthly")
    assert [get(client, key).status_code for _ in range(2)] == [200, 200]
    refused = get(client, key)
    assert_limited(refused, policy="month")
    until_the_first = refused.json()["retry_after"]  # seconds to 00:00 on the 1st, Paris time
    assert 0 < until_the_first <= 31 * 86400
    ratelimit.advance(max(until_the_first - 3600, 0))
    assert_limited(get(client, key), policy="month")  # the last hour of the month
    ratelimit.advance(3600)
    fresh = get(client, key)
    assert_not_limited(fresh)
    assert fresh["X-RateLimit-Remaining"] == "1"  # a new month: one of two used


def test_reset_forgets_the_counters_and_the_cached_denials(client: Client, ratelimit: IsolatedRateLimit) -> None:
    make_tier("hourly", HOURLY)
    key = make_api_key("hourly")
    assert [get(client, key).status_code for _ in range(3)] == [200, 200, 429]
    assert len(get_limiter().guard.deny_cache) == 1  # the refusal is answered in process until it expires
    ratelimit.reset()
    assert len(get_limiter().guard.deny_cache) == 0
    assert [get(client, key).status_code for _ in range(3)] == [200, 200, 429]


def test_a_cached_denial_ends_when_the_clock_is_moved_past_it(client: Client, ratelimit: IsolatedRateLimit) -> None:
    make_tier("hourly", HOURLY)
    key = make_api_key("hourly")
    assert [get(client, key).status_code for _ in range(3)] == [200, 200, 429]
    hits = get_limiter().guard.deny_cache.hits
    assert_limited(get(client, key))
    assert get_limiter().guard.deny_cache.hits == hits + 1  # answered in process, without Redis
    ratelimit.advance(3600)
    assert_not_limited(get(client, key))


def test_disable_and_enable_switch_every_limit_and_keep_the_counters(client: Client,
                                                                    ratelimit: IsolatedRateLimit) -> None:
    make_tier("hourly", HOURLY)
    key = make_api_key("hourly")
    assert [get(client, key).status_code for _ in range(3)] == [200, 200, 429]
    ratelimit.disable()
    assert ratelimit_settings.ENABLED is False
    answers = [get(client, key) for _ in range(3)] + [client.get("/public/quote") for _ in range(7)]
    assert [response.status_code for response in answers] == [200] * 10
    assert not any("X-RateLimit-Limit" in response for response in answers)  # nothing decided: no headers
    ratelimit.enable()
    assert_limited(get(client, key), policy="hour")  # counted before disable(); nothing counted since


def test_enable_restores_the_projects_own_switch(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "ENABLED": False}
    with IsolatedRateLimit() as state:
        state.disable()
        state.enable()
        assert ratelimit_settings.ENABLED is False  # the project's settings say so: enable() only undoes disable()


def test_the_clock_moves_only_while_the_settings_allow_it(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImproperlyConfigured, match="CLOCK_SHIFT"):
        clock.advance(1)  # no IsolatedRateLimit: the permission is not given
    with IsolatedRateLimit() as state:
        state.advance(1.0001)
        assert clock.offset_ms() == 1001  # milliseconds, rounded up
        with pytest.raises(ValueError, match="seconds"):
            state.advance(-1)
        monkeypatch.setattr(conf, "in_test_run", lambda: False)
        settings.DEBUG = False
        settings.RATELIMIT = {**settings.RATELIMIT}  # a change of RATELIMIT: the clock drops back
        assert clock.offset_ms() == 0
        with pytest.raises(ImproperlyConfigured, match="only in tests"):
            state.advance(1)
        monkeypatch.undo()
    assert clock.offset_ms() == 0 and conf.set_overlay({}) == {}


def test_a_state_is_used_once_started_and_stops_once() -> None:
    state = IsolatedRateLimit()
    with pytest.raises(RuntimeError, match="start"):
        state.advance(1)
    with state:
        with pytest.raises(RuntimeError, match="already started"):
            state.start()
    state.stop()  # a second stop does nothing
