"""Fixtures shared by the suite: a real Redis (see devtools.embedded) and per-test key prefixes."""

from __future__ import annotations

import os
import signal
import socket
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from redis.commands.core import ManagementCommands, ScriptCommands

from devtools.embedded import RedisProcess, redis_source, start_redis
from ratelimit_app import RateLimiter
from ratelimit_app.service.connection import redacted_url

DRF_SUITE_SETTINGS = "tests.drf_suite.settings"


def pytest_ignore_collect(collection_path: Any, config: Any) -> bool | None:
    """DRF's own throttling suite needs DRF's default settings from import on: it runs in a process
    of its own (`--ds=tests.drf_suite.settings`, see tests/drf_suite/conftest.py), and only there.
    The sample project is a project of its own, run with its own settings and pytest.ini
    (tests/sample_project/pytest.ini), never as part of this suite."""
    if collection_path.name == "drf_suite" and django_settings.SETTINGS_MODULE != DRF_SUITE_SETTINGS:
        return True
    if collection_path.name == "sample_project":
        return True
    return None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Say which Redis and which database the suite runs against (also with -q; not in xdist workers)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(session.config, "workerinput"):
        return
    url = str(django_settings.RATELIMIT["REDIS_URL"])
    reporter.write_line(f"Redis: {redacted_url(url)} ({redis_source(url)})")
    reporter.write_line(f"Database: {describe_database()}")


def describe_database() -> str:
    """The test database of DATABASES['default'] (pytest-django makes it; under xdist one per worker,
    named with the worker's suffix), and where its settings come from."""
    database = django_settings.DATABASES["default"]
    engine = database["ENGINE"].rsplit(".", 1)[-1]
    test_name = database.get("TEST", {}).get("NAME")
    source = "from DATABASE_URL" if os.environ.get("DATABASE_URL") else "SQLite: DATABASE_URL is not set"
    if engine == "sqlite3":
        return f"sqlite3 {test_name or 'in memory'} ({source})"
    where = f"{database.get('HOST') or 'localhost'}:{database.get('PORT') or 'default port'}"
    return f"{engine} {test_name or 'test_' + database['NAME']} on {where} ({source})"


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    """A redis-server of the test's own, which it may stop (SIGSTOP) or kill: never the shared Redis."""
    process = start_redis()
    yield process
    if process.process.poll() is None:
        process.process.send_signal(signal.SIGCONT)  # a stopped server would ignore the SIGTERM of stop()
    process.stop()


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis the suite runs against: the one the demo settings resolved."""
    return str(django_settings.RATELIMIT["REDIS_URL"])


#: Commands that empty a whole Redis server (every app's keys or loaded scripts): never on the suite's Redis.
DESTRUCTIVE_COMMANDS = ((ManagementCommands, "flushall"), (ManagementCommands, "flushdb"),
                        (ScriptCommands, "script_flush"))


def server_address(connection_kwargs: dict[str, Any]) -> tuple[str, Any]:
    """Where a client's connections go: ("unix", path) or (IP address, port)."""
    if connection_kwargs.get("path"):
        return ("unix", connection_kwargs["path"])
    host = str(connection_kwargs.get("host") or "localhost")
    try:
        host = socket.gethostbyname(host)
    except OSError:
        pass
    return (host, int(connection_kwargs.get("port") or 6379))


@pytest.fixture(scope="session", autouse=True)
def _never_flush_the_suites_redis(redis_url: str) -> Iterator[None]:
    """The suite never runs FLUSHALL, FLUSHDB or SCRIPT FLUSH on the Redis it is given (REDIS_URL may be a
    developer's own, shared with other apps): a test that needs one uses a Redis of its own (the `server`
    fixture, or a cluster it starts). Here, in the test process, a client of that Redis refuses them."""
    suites = server_address(redis.ConnectionPool.from_url(redis_url).connection_kwargs)
    originals = [(owner, name, getattr(owner, name)) for owner, name in DESTRUCTIVE_COMMANDS]

    def refusing(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def command(self: Any, *args: Any, **kwargs: Any) -> Any:
            pool = getattr(self, "connection_pool", None)
            if pool is not None and server_address(pool.connection_kwargs) == suites:
                raise AssertionError(f"{name} on the Redis the suite was given ({redacted_url(redis_url)}): "
                                     "use a Redis of the test's own (the `server` fixture)")
            return original(self, *args, **kwargs)
        return command

    for owner, name, original in originals:
        setattr(owner, name, refusing(name, original))
    yield
    for owner, name, original in originals:
        setattr(owner, name, original)


@pytest.fixture(scope="session")
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client: redis.Redis = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)
    yield client
    client.close()


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start:start + 500])


@pytest.fixture
def key_prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A key prefix no other test uses; every key under it is deleted after the test."""
    prefix = f"rltest-{uuid.uuid4().hex[:12]}"
    yield prefix
    delete_prefix(redis_client, prefix)


@pytest.fixture(autouse=True)
def _isolated_ratelimit_settings(settings: Any, key_prefix: str) -> None:
    """Every test limits under its own key prefix, with timeouts generous enough for a loaded CI box.

    Tests of timeouts and fail modes set their own values on top of these.
    """
    settings.RATELIMIT = {
        **settings.RATELIMIT,
        "KEY_PREFIX": key_prefix,
        "SOCKET_CONNECT_TIMEOUT": 2.0,
        "SOCKET_TIMEOUT": 5.0,
        "BUDGET_MS": 5000,
    }


@pytest.fixture(autouse=True)
def _fresh_log_once() -> None:
    """What `log_once` logged is per process: each test starts as a new process would."""
    from ratelimit_app.core import logs

    logs._logged_once.clear()


@pytest.fixture(params=["own", "pool"])
def connections(request: pytest.FixtureRequest) -> str:
    """How the sync engine reaches a standalone Redis: every engine test runs on both paths (the speed
    path's own per-thread connections, and the reference path through the client's pool)."""
    return str(request.param)


@pytest.fixture
def limiter(redis_client: redis.Redis, key_prefix: str, connections: str) -> RateLimiter:
    return RateLimiter(redis_client, prefix=key_prefix, connections=connections)
