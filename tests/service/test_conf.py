"""Settings are validated, reloaded on change, and misconfiguration shows up in `manage.py check`."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from devtools.embedded import free_port
from ratelimit_app.checks import check_settings
from ratelimit_app.service.conf import DEFAULTS, ratelimit_settings, set_overlay
from ratelimit_app.service.connection import get_redis
from tests.support.limits_support import attempts


def test_defaults_apply_and_overrides_reload(settings: Any) -> None:
    assert ratelimit_settings.FAIL_MODE == DEFAULTS["FAIL_MODE"]
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "closed"}
    assert ratelimit_settings.FAIL_MODE == "closed"


def test_unknown_setting_is_rejected_by_name(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MOD": "open"}
    with pytest.raises(ImproperlyConfigured, match="FAIL_MOD"):
        ratelimit_settings.FAIL_MODE  # noqa: B018


@pytest.mark.parametrize(
    ("name", "value"),
    [("FAIL_MODE", "sometimes"), ("HEADERS", "x"), ("SOCKET_TIMEOUT", 0), ("APP_SERVERS", 0),
     ("PATH_PREFIXES", "/api/"), ("IPV6_PREFIX", 129), ("TRUSTED_PROXIES", "10.0.0.0/8"),
     ("CONNECTIONS", "per_greenlet"), ("BACKEND", "locmem"), ("CLOCK_SHIFT", 1)],
)
def test_invalid_values_name_the_setting(settings: Any, name: str, value: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, name: value}
    with pytest.raises(ImproperlyConfigured, match=f"RATELIMIT\\['{name}'\\]"):
        ratelimit_settings.as_dict()


def test_the_overlay_is_laid_over_every_ratelimit_and_taken_away_whole(settings: Any) -> None:
    with pytest.raises(ValueError, match="KEY_PREFX are not RATELIMIT settings"):
        set_overlay({"KEY_PREFX": "x"})
    previous = set_overlay({"KEY_PREFIX": "laid-over", "IP_RATE": "5/m"})
    try:
        assert previous == {}
        settings.RATELIMIT = {"REDIS_URL": settings.RATELIMIT["REDIS_URL"], "KEY_PREFIX": "own", "IP_RATE": None}
        assert (ratelimit_settings.KEY_PREFIX, ratelimit_settings.IP_RATE) == ("laid-over", "5/m")
        settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "closed"}
        assert (ratelimit_settings.KEY_PREFIX, ratelimit_settings.FAIL_MODE) == ("laid-over", "closed")
    finally:
        assert set_overlay(previous) == {"KEY_PREFIX": "laid-over", "IP_RATE": "5/m"}
    assert (ratelimit_settings.KEY_PREFIX, ratelimit_settings.IP_RATE) == ("own", None)


def test_check_reports_invalid_settings_with_a_stable_id(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "sometimes"}
    assert [m.id for m in check_settings()] == ["ratelimit.E001"]
    with pytest.raises(SystemCheckError, match="ratelimit.E001"):
        call_command("check")


def test_unreachable_redis_is_a_warning_not_a_crash(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "CACHE_TTL": 5}
    messages = check_settings()
    assert [m.id for m in messages] == ["ratelimit.W001"]
    # what else it means: edits of plans are not announced (ratelimit_app.plans.edits)
    assert "reach other app servers within RATELIMIT['CACHE_TTL'] (5 s)" in str(messages[0].hint)
    call_command("check")  # warnings do not fail the check


def test_bad_url_scheme_names_the_setting(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": "http://127.0.0.1:6379"}
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL"):
        get_redis()
    assert [m.id for m in check_settings()] == ["ratelimit.E001"]


def test_malformed_cluster_address_is_an_unusable_redis_configuration(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": "redis+cluster://127.0.0.1"}
    messages = check_settings()
    assert [m.id for m in messages] == ["ratelimit.E002"]
    assert "must be host:port" in messages[0].msg


def test_cache_alias_must_be_django_redis(settings: Any) -> None:
    settings.CACHES = {**settings.CACHES, "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": None, "CACHE_ALIAS": "local"}
    with pytest.raises(ImproperlyConfigured, match="CACHE_ALIAS"):
        get_redis()


def test_cache_alias_reuses_the_django_redis_client(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": None, "CACHE_ALIAS": "default"}
    assert get_redis().ping()


def test_client_has_explicit_timeouts_and_no_retries(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.5}
    client = get_redis()
    assert isinstance(client, redis.Redis)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (0.25, 0.5)
    assert attempts(kwargs["retry"]) == 1


def test_unreachable_cluster_is_a_warning_not_a_crash(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis+cluster://127.0.0.1:{free_port()}"}
    assert [m.id for m in check_settings()] == ["ratelimit.W001"]


@pytest.mark.parametrize("connections", ["own", "pool"])
def test_the_connections_setting_chooses_the_engines_path(settings: Any, connections: str) -> None:
    from ratelimit_app import Policy, RateLimiter
    from ratelimit_app.service.limiter import get_limiter

    settings.RATELIMIT = {**settings.RATELIMIT, "CONNECTIONS": connections}
    service = get_limiter()
    engine = service.limiter()
    assert isinstance(engine, RateLimiter) and engine.connections == connections
    assert service.hit("k", [Policy("minute", "gcra", limit=2, period=60)]).remaining == 1
