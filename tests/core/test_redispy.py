"""ratelimit_app.core.redispy: the connection classes that clip every connect and reply wait to what is left of
the budget (against a redis-server of the test's own, stopped with SIGSTOP where a reply must never come),
and the version shims of the transports."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
from redis.connection import Connection, ConnectionPool, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import TimeoutError as RedisTimeout

from devtools.embedded import RedisProcess
from ratelimit_app.core import redispy
from ratelimit_app.core.redispy import (
    BudgetConnection,
    BudgetSSLConnection,
    BudgetUnixConnection,
    acheckout,
    aclosed_or_dirty,
    budget_class_for,
    checkout,
    close_client,
    connected,
    stale,
)
from tests.support.budget import within_budget


@pytest.fixture
def connection(server: RedisProcess) -> Iterator[BudgetConnection]:
    """A connection with generous timeouts of its own (5 s), so any quicker give-up is the budget's."""
    made = BudgetConnection(port=server.port, socket_timeout=5.0, socket_connect_timeout=5.0)
    yield made
    made.disconnect()


def test_outside_a_budget_the_connection_behaves_like_its_base(connection: BudgetConnection) -> None:
    connection.send_command("PING")
    assert connection.read_response() == b"PONG"
    assert connection.socket_connect_timeout == 5.0


def test_a_reply_that_never_comes_is_waited_for_only_until_the_budget_ends(
    connection: BudgetConnection, server: RedisProcess
) -> None:
    connection.connect()
    server.process.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    with within_budget(0.2), pytest.raises(RedisTimeout):
        connection.send_command("PING")
        connection.read_response()
    assert 0.15 < time.monotonic() - started < 2.0  # the socket's own 5 s never came into play


@pytest.fixture
def timeout_changes(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """Every timeout set on a socket during the test (each one two system calls on the request path)."""
    changes: list[float | None] = []
    settimeout = socket.socket.settimeout

    def counted(sock: socket.socket, value: float | None) -> None:
        changes.append(value)
        settimeout(sock, value)

    monkeypatch.setattr(socket.socket, "settimeout", counted)
    return changes


@pytest.mark.parametrize("on_the_socket", [False, True], ids=["this redis-py's way", "redis-py<8's way"])
def test_a_budget_as_loose_as_the_socket_timeout_leaves_the_socket_alone(
    server: RedisProcess, timeout_changes: list[float | None], monkeypatch: pytest.MonkeyPatch,
    on_the_socket: bool,
) -> None:
    """The clients' socket timeout equals the budget (it is clipped to it): a call's reads, a moment into
    the budget, are bounded by the socket's own timeout, and no timeout is set on the socket for them."""
    if on_the_socket:  # (redis-py < 8 takes no read timeout: the budget goes on the socket)
        monkeypatch.setattr(redispy, "_READ_TAKES_TIMEOUT", False)
    made = BudgetConnection(port=server.port, socket_timeout=0.05, socket_connect_timeout=0.05)
    made.connect()
    timeout_changes.clear()
    try:
        for _ in range(3):
            with within_budget(0.05):
                made.send_command("PING")
                assert made.read_response() == b"PONG"
        assert timeout_changes == []
        with within_budget(0.05, start=time.monotonic() - 0.04):  # most of it spent: the budget is tighter
            made.send_command("PING")
            assert made.read_response() == b"PONG"
        assert len(timeout_changes) == 2 and timeout_changes[-1] == 0.05  # clipped, then put back
    finally:
        made.disconnect()


def test_a_connect_after_the_budget_ran_out_is_refused_before_touching_the_network(
    connection: BudgetConnection, server: RedisProcess
) -> None:
    server.process.send_signal(signal.SIGSTOP)  # a connect attempt would hang in the handshake
    started = time.monotonic()
    with within_budget(0.1, start=time.monotonic() - 1.0), pytest.raises(RedisTimeout, match="connecting") as raised:
        connection.connect()
    assert "time budget ran out before connecting" in str(raised.value.__context__)
    assert time.monotonic() - started < 0.5
    assert connection._sock is None


def test_a_budget_clips_the_connect_timeout_and_the_configured_one_comes_back_after_it(
    connection: BudgetConnection,
) -> None:
    with within_budget(0.75):
        connection.connect()
        clipped = connection.socket_connect_timeout
    assert clipped is not None and clipped <= 0.75
    connection.disconnect()
    connection.connect()  # outside the budget
    assert connection.socket_connect_timeout == 5.0
    with within_budget(60.0):  # a looser budget keeps the configured timeout
        connection.disconnect()
        connection.connect()
        assert connection.socket_connect_timeout == 5.0


def test_on_a_client_that_cannot_pass_a_read_timeout_the_budget_goes_on_the_socket_for_one_reply(
    connection: BudgetConnection, server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py < 8 reads with the socket's own timeout: the budget is set on the socket for the reply,
    and the configured timeout is put back after it."""
    monkeypatch.setattr(redispy, "_READ_TAKES_TIMEOUT", False)
    connection.connect()
    with within_budget(2.0):
        connection.send_command("PING")
        assert connection.read_response() == b"PONG"
    assert connection._sock is not None and connection._sock.gettimeout() == 5.0
    server.process.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    with within_budget(0.2), pytest.raises(RedisTimeout):
        connection.send_command("PING")
        connection.read_response()
    assert time.monotonic() - started < 2.0


def test_budget_class_for_maps_each_redis_py_class_to_its_budget_twin() -> None:
    assert budget_class_for(Connection) is BudgetConnection
    assert budget_class_for(SSLConnection) is BudgetSSLConnection
    assert budget_class_for(UnixDomainSocketConnection) is BudgetUnixConnection
    assert budget_class_for(BudgetSSLConnection) is BudgetSSLConnection

    class Custom(Connection):
        pass

    assert budget_class_for(Custom) is None  # an unknown subclass is not silently replaced


def _kill_clients(server: RedisProcess) -> None:
    admin = redis.Redis(port=server.port)
    admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    admin.close()


def test_a_connection_the_server_closed_is_seen_stale_before_use(server: RedisProcess) -> None:
    pool = ConnectionPool(connection_class=BudgetConnection, port=server.port)
    connection = checkout(pool)  # (connected by the checkout)
    connection.disconnect()
    assert not connected(connection)
    connection.connect()
    assert connected(connection) and not stale(connection)
    _kill_clients(server)
    deadline = time.monotonic() + 5.0
    while not stale(connection):
        assert time.monotonic() < deadline, "the closed connection was never seen"
        time.sleep(0.01)
    pool.disconnect()


def test_the_async_shims_check_out_see_a_closed_connection_and_close_the_client(server: RedisProcess) -> None:
    async def scenario() -> bool:
        client = redis.asyncio.Redis(port=server.port)
        try:
            connection = await acheckout(client.connection_pool)
            await connection.connect()
            assert not await aclosed_or_dirty(connection)
            _kill_clients(server)
            deadline = time.monotonic() + 5.0
            while not await aclosed_or_dirty(connection):
                assert time.monotonic() < deadline, "the closed connection was never seen"
                await asyncio.sleep(0.01)
            await client.connection_pool.release(connection)
            return True
        finally:
            await close_client(client)

    assert asyncio.run(scenario())
