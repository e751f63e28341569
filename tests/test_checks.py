"""`manage.py check` catches every mistake in the settings before the first request, with stable ids."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError


def ratelimit_messages(databases: list[str] | None = None) -> list[checks.CheckMessage]:
    # databases=[]: no database check unless asked (Django 6.1 runs them on every database by default)
    messages = checks.run_checks(tags=["ratelimit"], databases=databases or [])
    return [m for m in messages if (m.id or "").startswith("ratelimit.")]


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("IP_RATE", "ten/m", "'100/m'"),
        ("IP_RATE", "0/m", "'100/m'"),
        ("IP_RATE", "10/0s", "'100/m'"),
        ("IP_ALGORITHM", "bogus", "'sliding_window_counter'"),
        ("KEY_PREFIX", "has space", "1 to 64 letters"),
        ("KEY_PREFIX", "", "1 to 64 letters"),
        ("KEY_PREFIX", "p" * 65, "1 to 64 letters"),
        ("TRUSTED_PROXIES", ["10.0.0.0/33"], "list of proxy CIDRs"),
        ("API_KEY_HEADER", "", "'X-API-Key'"),
        ("ANONYMOUS_TIER", "", "slug of a tier"),
        ("DEFAULT_USER_TIER", 7, "slug of a tier"),
        ("ENABLED", "False", "True or False"),
        ("REQUIRE_API_KEY", "yes", "True (a request with neither a key of ours"),
        ("PATH_PREFIXES", ["api/"], "starting with '/'"),
        ("BREAKER_MAX_COOLDOWN", 0.5, "RATELIMIT['BREAKER_COOLDOWN']"),
    ],
)
def test_each_invalid_setting_is_an_error_naming_it_and_the_accepted_values(
    settings: Any, name: str, value: Any, accepted: str
) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, name: value}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E001"]
    assert f"RATELIMIT['{name}'] is {value!r}" in messages[0].msg
    assert accepted in messages[0].msg
    with pytest.raises(SystemCheckError, match=r"ratelimit\.E001"):
        call_command("check")


def test_without_redis_url_the_cache_alias_must_name_a_cache(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "CACHE_ALIAS": "nowhere"}
    assert ratelimit_messages() == []  # REDIS_URL is set: no shared lookup cache, which is allowed
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": None}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E001"]
    assert "RATELIMIT['CACHE_ALIAS'] is 'nowhere', which is not in settings.CACHES" in messages[0].msg


def test_a_per_ip_limit_of_zero_is_refused_for_locking_everyone_out(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": "0/m"}
    assert "refuse every client" in ratelimit_messages()[0].msg


def test_every_invalid_setting_is_reported_at_once(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_ALGORITHM": "bogus", "KEY_PREFIX": "", "API_KEY_HEADER": ""}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E001"] * 3
    assert ["KEY_PREFIX" in messages[0].msg, "IP_ALGORITHM" in messages[1].msg, "API_KEY_HEADER" in messages[2].msg] \
        == [True, True, True]


def test_the_default_and_demo_settings_pass(settings: Any) -> None:
    assert ratelimit_messages() == []


def test_require_api_key_beside_an_anonymous_tier_is_an_error(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REQUIRE_API_KEY": True, "ANONYMOUS_TIER": "free"}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E001"]
    assert "RATELIMIT['REQUIRE_API_KEY'] is True while RATELIMIT['ANONYMOUS_TIER'] is 'free'" in messages[0].msg
    assert "that tier would never apply" in messages[0].msg
    settings.RATELIMIT = {**settings.RATELIMIT, "REQUIRE_API_KEY": False}
    assert ratelimit_messages() == []


@pytest.mark.parametrize("value", ["5/10m", "1000/d", None])
def test_valid_ip_rates_pass(settings: Any, value: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": value, "IP_ALGORITHM": "gcra"}
    assert ratelimit_messages() == []


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["ANONYMOUS_TIER", "DEFAULT_USER_TIER"])
def test_a_tier_setting_naming_no_tier_fails_the_database_check(settings: Any, name: str) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REQUIRE_API_KEY": False, name: "gold"}
    assert ratelimit_messages() == []  # without --database, no query
    messages = ratelimit_messages(databases=["default"])
    assert [m.id for m in messages] == ["ratelimit.E003"]
    assert f"RATELIMIT['{name}'] is 'gold'" in messages[0].msg
    assert "'enterprise', 'free', 'pro'" in messages[0].msg
    with pytest.raises(SystemCheckError, match=r"ratelimit\.E003"):
        call_command("check", databases=["default"])


@pytest.mark.django_db
def test_existing_tiers_pass_the_database_check(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REQUIRE_API_KEY": False, "ANONYMOUS_TIER": "free",
                          "DEFAULT_USER_TIER": "pro"}
    assert ratelimit_messages(databases=["default"]) == []


def test_the_redis_version_is_read_from_the_server_itself() -> None:
    from ratelimit_app.checks import _server_versions
    from ratelimit_app.service.connection import get_redis

    client = get_redis()
    assert _server_versions(client.info("server")) == {"": client.info("server")["redis_version"]}


@pytest.mark.parametrize(
    ("versions", "old"),
    [
        ({"": "6.2.0"}, []),
        ({"": "7.0.15"}, []),
        ({"": "10.0.1"}, []),
        ({"": "6.0.20"}, ["6.0.20"]),
        ({"": "5.0.14"}, ["5.0.14"]),
        ({"10.0.0.2:7001": "7.2.4", "10.0.0.1:7000": "6.0.9"}, ["10.0.0.1:7000: 6.0.9"]),
    ],
)
def test_servers_older_than_6_2_are_named(versions: dict[str, str], old: list[str]) -> None:
    from ratelimit_app.checks import _old_servers

    assert _old_servers(versions) == old



REDIS_LOCATION = "redis://:s3cret-password@127.0.0.1:6379/0"


@pytest.mark.parametrize(("backend", "options", "location"), [
    ("django_redis.cache.RedisCache", {}, REDIS_LOCATION),
    ("django_redis.cache.RedisCache", {"SOCKET_CONNECT_TIMEOUT": 0.5}, REDIS_LOCATION),
    ("django_redis.cache.RedisCache", {"SOCKET_TIMEOUT": None}, REDIS_LOCATION),
    ("django.core.cache.backends.redis.RedisCache", {}, REDIS_LOCATION),
    ("django.core.cache.backends.memcached.PyMemcacheCache", {}, "127.0.0.1:11211"),
])
def test_a_shared_cache_without_a_socket_timeout_is_a_warning(settings: Any, backend: str, options: dict[str, Any],
                                                              location: str) -> None:
    settings.CACHES = {**settings.CACHES, "lookups": {"BACKEND": backend, "LOCATION": location, "OPTIONS": options}}
    settings.RATELIMIT = {**settings.RATELIMIT, "CACHE_ALIAS": "lookups"}
    [warning] = [m for m in ratelimit_messages() if m.id == "ratelimit.W020"]
    assert "CACHES['lookups']" in warning.msg and "RATELIMIT['CACHE_ALIAS']" in warning.msg
    assert "s3cret" not in warning.msg + str(warning.hint)  # a LOCATION may hold a password: never printed


@pytest.mark.parametrize(("backend", "options", "location"), [
    ("django_redis.cache.RedisCache", {"SOCKET_TIMEOUT": 0.5}, REDIS_LOCATION),
    ("django_redis.cache.RedisCache", {"CONNECTION_POOL_KWARGS": {"socket_timeout": 0.5}}, REDIS_LOCATION),
    ("django_redis.cache.RedisCache", {}, REDIS_LOCATION + "?socket_timeout=0.5"),
    ("django.core.cache.backends.redis.RedisCache", {"socket_timeout": 0.5}, REDIS_LOCATION),
    ("django.core.cache.backends.redis.RedisCache", {}, [REDIS_LOCATION + "?socket_timeout=0.5"]),
    ("django.core.cache.backends.memcached.PyMemcacheCache", {"timeout": 0.5}, "127.0.0.1:11211"),
    ("django.core.cache.backends.locmem.LocMemCache", {}, ""),
    ("django.core.cache.backends.db.DatabaseCache", {}, "cache_table"),
])
def test_a_shared_cache_with_a_socket_timeout_or_no_socket_passes(settings: Any, backend: str,
                                                                 options: dict[str, Any], location: Any) -> None:
    settings.CACHES = {**settings.CACHES, "lookups": {"BACKEND": backend, "LOCATION": location, "OPTIONS": options}}
    settings.RATELIMIT = {**settings.RATELIMIT, "CACHE_ALIAS": "lookups"}
    assert "ratelimit.W020" not in [m.id for m in ratelimit_messages()]


def test_the_clock_shift_outside_debug_and_tests_is_an_error(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ratelimit_app.conf import settings as conf

    settings.RATELIMIT = {**settings.RATELIMIT, "CLOCK_SHIFT": True}
    assert ratelimit_messages() == []  # a test run: the test kit sets it
    monkeypatch.setattr(conf, "in_test_run", lambda: False)
    monkeypatch.setattr("ratelimit_app.checks.in_test_run", lambda: False)
    settings.DEBUG = True
    assert ratelimit_messages() == []  # a developer's machine
    settings.DEBUG = False
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E040"]
    assert "RATELIMIT['CLOCK_SHIFT'] is True with DEBUG off outside a test run" in messages[0].msg
    assert not conf.clock_shift_allowed(conf.read_settings()[0])  # and it is never honoured there
    with pytest.raises(SystemCheckError, match=r"ratelimit\.E040"):
        call_command("check")


def test_the_memory_backend_asks_no_redis_and_is_a_warning_where_each_process_counts_alone(
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "BACKEND": "memory", "REDIS_URL": "redis://127.0.0.1:1/0"}
    assert ratelimit_messages() == []  # in tests, one process: fine, and the unreachable Redis is not asked
    settings.RATELIMIT = {**settings.RATELIMIT, "APP_SERVERS": 4}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.W040"]
    assert "RATELIMIT['BACKEND'] is 'memory' with 4 processes: each process counts its clients alone" in messages[0].msg
    settings.RATELIMIT = {**settings.RATELIMIT, "APP_SERVERS": 1}
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    assert "with 3 processes" in ratelimit_messages()[0].msg
    monkeypatch.delenv("WEB_CONCURRENCY")
    monkeypatch.setattr("ratelimit_app.checks.in_test_run", lambda: False)
    assert "with DEBUG off outside a test run" in ratelimit_messages()[0].msg
    settings.DEBUG = True
    assert ratelimit_messages() == []


def test_limits_switched_off_outside_debug_and_tests_are_a_warning_of_check_deploy(
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "ENABLED": False}
    assert ratelimit_messages() == []  # a test run: turning the limits off is the test kit's own switch
    monkeypatch.setattr("ratelimit_app.checks.in_test_run", lambda: False)
    settings.DEBUG = True
    assert ratelimit_messages() == []  # a developer's machine
    settings.DEBUG = False
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.W041"]
    assert "RATELIMIT['ENABLED'] is False with DEBUG off outside a test run: no limit of ours applies" in \
        messages[0].msg
    out = StringIO()
    call_command("check", "--deploy", stdout=out, stderr=out)
    assert "(ratelimit.W041) RATELIMIT['ENABLED'] is False" in out.getvalue()
    settings.RATELIMIT = {**settings.RATELIMIT, "ENABLED": True}
    assert ratelimit_messages() == []


# -- settings that pass their type but disable or weaken limiting ----------------------------------

@pytest.mark.parametrize(
    ("name", "value", "consequence"),
    [
        ("BUDGET_MS", 0.05, "milliseconds"),
        ("EXEMPT_PATHS", ["/"], "exempts every path under RATELIMIT['PATH_PREFIXES'] entry '/api/'"),
        ("EXEMPT_PATHS", ["/health", "/api"], "exempts every path under RATELIMIT['PATH_PREFIXES'] entry '/api/'"),
        ("TRUSTED_PROXIES", ["0.0.0.0/0"], "clients could choose their IP"),
        ("TRUSTED_PROXIES", ["10.0.0.0/8", "::/0"], "clients could choose their IP"),
        ("METRICS_ALLOWED_IPS", ["0.0.0.0/0", "::/0"], "open GET /metrics"),
        ("CACHE_TTL", 1e9, "a revoked key"),
        ("IPV6_PREFIX", 1, "whole providers"),
        ("API_KEY_HEADER", "Authorization", "Bearer"),
        ("API_KEY_HEADER", "cookie", "reserved"),
        ("REDIS_URL", "redis://127.0.0.1:6379/0?socket_timeout=x", "query parameter 'socket_timeout'"),
        ("REDIS_URL", "redis://127.0.0.1:6379/0?db=abc", "query parameter 'db'"),
        ("REDIS_URL", "rediss://127.0.0.1:6379/0?ssl_cert_reqs=bogus", "query parameter 'ssl_cert_reqs'"),
        ("REDIS_URL", "redis://127.0.0.1:63x9/0", "port"),
        ("REDIS_URL", "redis://127.0.0.1:6379/abc", "database"),
    ],
)
def test_settings_that_would_silently_disable_or_weaken_limiting_are_errors(
    settings: Any, name: str, value: Any, consequence: str
) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, name: value}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E001"]
    assert f"RATELIMIT['{name}']" in messages[0].msg and consequence in messages[0].msg
    with pytest.raises(SystemCheckError, match=r"ratelimit\.E001"):
        call_command("check")


def test_a_redis_database_the_server_refuses_is_an_error_not_an_outage(settings: Any, redis_url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(redis_url)
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": parts._replace(path="/99").geturl()}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E020"]
    assert "refused" in messages[0].msg and "DB index is out of range" in messages[0].msg


def test_credentials_the_server_refuses_are_an_error_that_never_shows_them(settings: Any, server: Any) -> None:
    import redis

    with redis.Redis(port=server.port) as own:  # the test's own server, never the shared one
        own.config_set("requirepass", "the-right-password-0123")
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://:{SECRET}@127.0.0.1:{server.port}/0"}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E020"]
    assert "refused" in messages[0].msg and SECRET not in f"{messages[0].msg} {messages[0].hint}"


@pytest.mark.parametrize("how", ["setting", "scheme"])
def test_cluster_mode_against_a_standalone_server_is_an_error(settings: Any, redis_url: str, how: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(redis_url)
    extra = {"CLUSTER": True} if how == "setting" else {"REDIS_URL": parts._replace(scheme="redis+cluster",
                                                                                     path="").geturl()}
    settings.RATELIMIT = {**settings.RATELIMIT, **extra}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E021"]
    assert "not a cluster node" in messages[0].msg


# -- secrets: no value that can hold one is ever printed -----------------------------------------

SECRET = "hunter2hunter2"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("METRICS_TOKEN", f"has a space {SECRET}"),
        ("METRICS_TOKEN", SECRET[:10]),
        ("REDIS_URL", f"htp://:{SECRET}@127.0.0.1:6379/0"),
        ("REDIS_URL", f"redis//:{SECRET}@127.0.0.1:6379/0"),
        ("REDIS_URL", f"redis://:{SECRET}@127.0.0.1:6379/0?socket_timeout=x"),
        ("REDIS_URL", f"redis+cluster://:{SECRET}@127.0.0.1"),
        ("REDIS_URL", f"redis+sentinel://:{SECRET}@127.0.0.1/mymaster"),
    ],
)
def test_check_never_prints_a_secret(settings: Any, name: str, value: str) -> None:
    from io import StringIO

    settings.RATELIMIT = {**settings.RATELIMIT, name: value}
    messages = ratelimit_messages()
    assert messages and all(f"RATELIMIT['{name}']" in m.msg for m in messages)
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemCheckError) as excinfo:
        call_command("check", stdout=out, stderr=err)
    shown = str(excinfo.value) + out.getvalue() + err.getvalue() + " ".join(f"{m.msg} {m.hint}" for m in messages)
    secret = SECRET[:10] if value == SECRET[:10] else SECRET
    assert secret not in shown
