"""Which failures of SCRIPT LOAD mean a server that cannot run Lua scripts (ScriptsRefused), and which
are an outage like any other (tests/test_servers.py meets a real one)."""

from __future__ import annotations

import pytest
import redis

from ratelimit_app.core.exceptions import BackendError, ScriptsRefused, refuses_scripts, scripts_refused

REFUSALS = [
    redis.ResponseError("Could not find scripting engine 'lua'"),  # Valkey 9.1+ without its lua module
    redis.exceptions.NoPermissionError("this user has no permissions to run the 'script|load' command"),
    redis.ResponseError("unknown command 'SCRIPT', with args beginning with: 'LOAD'"),  # renamed away
]
PASSING = [
    redis.ResponseError("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."),
    redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    redis.ResponseError("CLUSTERDOWN The cluster is down"),
    redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
    redis.TimeoutError("Timeout reading from socket"),
]


@pytest.mark.parametrize("error", REFUSALS)
def test_a_refusal_of_scripting_itself_is_scripts_refused_quoting_the_server(error: Exception) -> None:
    assert refuses_scripts(error)
    refused = scripts_refused(error)
    assert isinstance(refused, ScriptsRefused) and isinstance(refused, BackendError)
    assert not refused.maybe_applied
    assert str(refused) == f"the server cannot run Lua scripts: SCRIPT LOAD answered {error}"


@pytest.mark.parametrize("error", PASSING)
def test_an_outage_or_a_passing_refusal_is_not(error: Exception) -> None:
    assert not refuses_scripts(error)
    assert scripts_refused(error) is None
