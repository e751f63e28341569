"""Settings are validated, reloaded on change, and misconfiguration shows up in `manage.py check`."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from devtools.embedded import free_port
from ratelimit_app.checks import check_settings
from ratelimit_app.conf.settings import DEFAULTS, ratelimit_settings, read_settings, set_overlay
from ratelimit_app.service.connection import get_redis
from tests.support.limits_support import attempts


def test_defaults_apply_and_overrides_reload(settings: Any) -> None:
    assert ratelimit_settings.FAIL_MODE == DEFAULTS["FAIL_MODE"]
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "closed"}
    assert ratelimit_settings.FAIL_MODE == "closed"


def test_unknown_setting_is_rejected_by_name(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MOD": "closed"}
    errors = read_settings()[1]
    assert [error.setting for error in errors] == ["RATELIMIT"] and "FAIL_MOD" in errors[0].message
    assert [m.id for m in check_settings()] == ["ratelimit.E001"]


@pytest.mark.parametrize(
    ("name", "value"),
    [("FAIL_MODE", "sometimes"), ("HEADERS", "x"), ("SOCKET_TIMEOUT", 0), ("APP_SERVERS", 0),
     ("PATH_PREFIXES", "/api/"), ("IPV6_PREFIX", 129), ("TRUSTED_PROXIES", "10.0.0.0/8"),
     ("CONNECTIONS", "per_greenlet"), ("BACKEND", "locmem"), ("CLOCK_SHIFT", 1)],
)
def test_invalid_values_name_the_setting(settings: Any, name: str, value: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, name: value}
    errors = read_settings()[1]
    assert [error.setting for error in errors] == [name] and f"RATELIMIT['{name}']" in errors[0].message


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


@pytest.mark.parametrize("query", ["socket_timeout=x", "db=abc"])
def test_health_says_misconfigured_for_a_redis_url_redis_py_cannot_parse(client: Any, settings: Any,
                                                                         query: str) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:6379/0?{query}"}
    response = client.get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok", "redis": "misconfigured"}


def test_malformed_cluster_address_is_an_invalid_redis_url(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": "redis+cluster://127.0.0.1"}
    messages = check_settings()
    assert [m.id for m in messages] == ["ratelimit.E001"]
    assert "RATELIMIT['REDIS_URL'] is invalid: an address in it is not host:port" in messages[0].msg


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


# -- invalid settings met at run time (no `check`): the most cautious reading, said once -----------

def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


def down(settings: Any, **values: Any) -> None:
    """RATELIMIT with a Redis that does not answer (the fail mode decides every request)."""
    use(settings, REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", SOCKET_CONNECT_TIMEOUT=0.2, SOCKET_TIMEOUT=0.2,
        BUDGET_MS=500, **values)


@pytest.mark.parametrize(("written", "read"), [
    ("Closed", "closed"), (" closed ", "closed"), ("LOCAL", "local"), ("Open\n", "open"),
    ("bogus", "closed"), ("", "closed"), (None, "closed"), (0, "closed"),
])
def test_an_invalid_fail_mode_is_read_as_the_mode_it_spells_else_closed(settings: Any, written: Any,
                                                                        read: str) -> None:
    use(settings, FAIL_MODE=written)
    assert ratelimit_settings.FAIL_MODE == read


@pytest.mark.django_db
def test_fail_mode_closed_mistyped_fails_closed_not_open(client: Any, settings: Any) -> None:
    from tests.support.limits_support import make_key, seed_tiers

    seed_tiers()
    key = make_key("free")
    down(settings, FAIL_MODE="Closed")
    response = client.get("/api/users", HTTP_X_API_KEY=key)
    assert response.status_code == 503 and response.json()["error"] == "rate limiter unavailable"


@pytest.mark.django_db
def test_an_unreadable_setting_makes_limited_requests_follow_the_cautious_fail_mode(client: Any,
                                                                                    settings: Any) -> None:
    use(settings, FAIL_MODE="Closed", IP_RATE="lots")
    assert client.get("/api/users").status_code == 503
    assert client.get("/health").status_code == 200
    assert client.get("/admin/login/").status_code == 200


@pytest.mark.parametrize(("name", "written", "read"), [
    ("HEADERS", "Both", "both"),
    ("HEADERS", "all", "both"),
    ("ERROR_FORMAT", "Problem", "problem"),
    ("ERROR_FORMAT", "xml", "json"),
    ("HEADER_DRAFT", "draft-12", "draft-11"),
    ("IP_ALGORITHM", "GCRA", "gcra"),
    ("ENABLED", "False", True),
    ("IP_SHADOW", "yes", False),
    ("PATH_PREFIXES", "/api/", ["/api/"]),
    ("PATH_PREFIXES", ["api/", "/v2/", 3], ["/api/", "/v2/"]),
    ("EXEMPT_PATHS", ["/health", "/", 3, "api"], ["/health"]),
    ("TRUSTED_PROXIES", ["10.0.0.0/33", "10.1.0.0/16", "0.0.0.0/0"], ["10.1.0.0/16"]),
    ("METRICS_ALLOWED_IPS", "127.0.0.1", ["127.0.0.1"]),
    ("METRICS_ALLOWED_IPS", ["::/0", "bogus", "10.0.0.5"], ["10.0.0.5"]),
    ("CACHE_TTL", 1e9, 3600),
    ("BREAKER_MAX_COOLDOWN", 0.5, 1.0),
])
def test_invalid_settings_with_a_cautious_reading_are_read_that_way(settings: Any, name: str, written: Any,
                                                                    read: Any) -> None:
    use(settings, **{name: written})
    assert getattr(ratelimit_settings, name) == read


@pytest.mark.parametrize(("name", "written"), [
    ("IP_RATE", "lots"), ("KEY_PREFIX", ""), ("BUDGET_MS", 0.05), ("API_KEY_HEADER", "Authorization"),
    ("IPV6_PREFIX", 1), ("SHED_CAPACITY", "10"), ("METRICS_TOKEN", "short"),
])
def test_invalid_settings_without_a_reading_raise_naming_the_setting_not_the_value(settings: Any, name: str,
                                                                                   written: Any) -> None:
    from ratelimit_app.conf.settings import InvalidSetting

    use(settings, **{name: written})
    with pytest.raises(InvalidSetting, match=rf"RATELIMIT\['{name}'\] is invalid") as excinfo:
        getattr(ratelimit_settings, name)
    assert repr(written) not in str(excinfo.value)
    assert ratelimit_settings.FAIL_MODE == "open"  # the others are read as written


@pytest.mark.django_db
def test_invalid_settings_are_logged_once_per_process_without_a_traceback(client: Any, settings: Any,
                                                                          caplog: Any) -> None:
    use(settings, FAIL_MODE="Closed", IP_RATE="lots", HEADERS="Both")
    with caplog.at_level(logging.DEBUG, logger="ratelimit_app"):
        assert [client.get("/api/users").status_code for _ in range(3)] == [503] * 3
        ratelimit_settings.reload()  # read again (a worker that reloads them): not said again
        assert client.get("/api/users").status_code == 503
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "ratelimit_app"]
    assert len(errors) == 1 and errors[0].exc_info is None
    message = errors[0].getMessage()
    assert "FAIL_MODE" in message and "'closed'" in message and "HEADERS" in message and "IP_RATE" in message
    assert "manage.py check" in message


SECRET = "hunter2hunter2"


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "value"), [
    ("METRICS_TOKEN", f"has a space {SECRET}"),
    ("REDIS_URL", f"htp://:{SECRET}@127.0.0.1:6379/0"),
    ("REDIS_URL", f"redis://:{SECRET}@127.0.0.1:6379/0?socket_timeout=x"),
    ("REDIS_URL", f"redis+cluster://:{SECRET}@127.0.0.1"),
])
def test_no_log_record_ever_holds_a_secret_setting(client: Any, admin_client: Any, settings: Any, caplog: Any,
                                                   name: str, value: str) -> None:
    use(settings, **{name: value})
    with caplog.at_level(logging.DEBUG):
        client.get("/api/users")
        client.get("/api/users", HTTP_AUTHORIZATION=f"Bearer {SECRET}")
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {SECRET}")
        client.get("/health")
        admin_client.get("/admin/ratelimit_app/dashboard/")
    formatter = logging.Formatter("%(message)s")
    shown = [formatter.format(record) for record in caplog.records]  # message, traceback and chained causes
    assert shown and not [text for text in shown if SECRET in text]


def test_under_gunicorn_an_invalid_ratelimit_fails_the_way_written_and_is_said_once_per_worker(
        tmp_path: Any, redis_url: str) -> None:
    """The run the settings were mistyped in: gunicorn, no `check`. FAIL_MODE "Closed" closes, the rest
    of the site answers, one log line per worker says it, and neither a traceback nor the token shows."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import requests

    from tests.support.gunicorn_server import start_server

    invalid = {"FAIL_MODE": "Closed", "IP_RATE": "lots", "METRICS_TOKEN": f"has a space {SECRET}",
               "METRICS_ALLOWED_IPS": []}  # (valid: the demo lets 127.0.0.1 read /metrics)
    env = {**os.environ, "REDIS_URL": redis_url, "RATELIMIT_TEST_PREFIX": f"rltest-live-{os.urandom(6).hex()}",
           "DJANGO_SETTINGS_MODULE": "tests.support.invalid_settings_server_settings",
           "RATELIMIT_TEST_INVALID": json.dumps(invalid), "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
           "RATELIMIT_LOG_LEVEL": "INFO"}
    port = free_port()
    command = [str(Path(sys.executable).parent / "gunicorn"), "project.wsgi:application", "--workers", "2",
               "--bind", f"127.0.0.1:{port}", "--timeout", "60"]
    server = start_server(command, port, env, wait=60)
    try:
        base = f"http://127.0.0.1:{port}"
        assert [requests.get(f"{base}/api/users", timeout=10).status_code for _ in range(12)] == [503] * 12
        assert requests.get(f"{base}/health", timeout=10).json() == {"status": "ok", "redis": "up"}
        metrics = requests.get(f"{base}/metrics", headers={"Authorization": f"Bearer {SECRET}"}, timeout=10)
        assert metrics.status_code == 503 and "METRICS_TOKEN" in metrics.json()["detail"]
    finally:
        server.terminate()
        try:
            _, stderr_bytes = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            _, stderr_bytes = server.communicate()
    stderr = stderr_bytes.decode()
    lines = [line for line in stderr.splitlines() if "ratelimit.invalid_settings" in line]
    assert 1 <= len(lines) <= 2, stderr[-3000:]  # once per worker process that read the settings
    assert "FAIL_MODE='closed'" in lines[0] and "IP_RATE" in lines[0] and "METRICS_TOKEN" in lines[0]
    assert "Traceback" not in stderr and SECRET not in stderr
