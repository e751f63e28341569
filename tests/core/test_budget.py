"""ratelimit_app.core.budget: `within_budget` and `time_left`, and the connection classes that clip every
connect and reply wait to what is left of the budget (against a redis-server of the test's own, stopped
with SIGSTOP where a reply must never come)."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator

import pytest
from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import TimeoutError as RedisTimeout

from devtools.embedded import RedisProcess
from ratelimit_app.core import budget
from ratelimit_app.core.budget import (
    BudgetConnection,
    BudgetSSLConnection,
    BudgetUnixConnection,
    budget_class_for,
    time_left,
    within_budget,
)


@pytest.fixture
def connection(server: RedisProcess) -> Iterator[BudgetConnection]:
    """A connection with generous timeouts of its own (5 s), so any quicker give-up is the budget's."""
    made = BudgetConnection(port=server.port, socket_timeout=5.0, socket_connect_timeout=5.0)
    yield made
    made.disconnect()


def test_time_left_is_none_outside_a_budget_and_counts_down_inside() -> None:
    assert time_left() is None
    with within_budget(10.0):
        left = time_left()
        assert left is not None and 9.0 < left <= 10.0
    assert time_left() is None


def test_a_budget_counts_from_its_start_and_may_be_spent_before_it_is_entered() -> None:
    with within_budget(0.5, start=time.monotonic() - 2.0):
        left = time_left()
        assert left is not None and left <= -1.5


def test_the_inner_of_nested_budgets_applies_until_it_ends_then_the_outer_again() -> None:
    with within_budget(100.0):
        with within_budget(1.0):
            inner = time_left()
            assert inner is not None and inner <= 1.0
        outer = time_left()
        assert outer is not None and outer > 99.0
        with within_budget(1000.0):  # a looser inner budget is not clipped by the outer one either
            looser = time_left()
            assert looser is not None and looser > 999.0


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


@pytest.mark.parametrize("takes_timeout", [True, False], ids=["redis-py>=8", "redis-py<8"])
def test_a_budget_as_loose_as_the_socket_timeout_leaves_the_socket_alone(
    server: RedisProcess, timeout_changes: list[float | None], monkeypatch: pytest.MonkeyPatch,
    takes_timeout: bool,
) -> None:
    """The clients' socket timeout equals the budget (it is clipped to it): a call's reads, a moment into
    the budget, are bounded by the socket's own timeout, and no timeout is set on the socket for them."""
    monkeypatch.setattr(budget, "_READ_TAKES_TIMEOUT", takes_timeout)
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
    monkeypatch.setattr(budget, "_READ_TAKES_TIMEOUT", False)
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
