"""The one seam to redis-py: every difference between its supported versions (5.0 to 8.x) and every internal of
it the limiter relies on, so the rest of the package uses its public API only. It holds the connections
and the blocking pool that keep each connect and reply wait within the time budget (core.budget)."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import redis
from redis.client import NEVER_DECODE
from redis.connection import Connection, ConnectionPool, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import RedisError
from redis.sentinel import SentinelManagedConnection

from .budget import time_left
from .exceptions import REDIS_CLIENT_ERRORS

#: The keyword of `execute_command` that leaves a reply as bytes (the limiter's replies are binary).
BINARY_REPLY: dict[str, Any] = {NEVER_DECODE: True}


def _no_handshake_options() -> dict[str, Any]:
    # A new connection should cost the TCP connect and nothing more: with RESP3 (the default of recent
    # redis-py) it would first send HELLO and CLIENT MAINT_NOTIFICATIONS, and CLIENT SETINFO twice:
    # up to four round trips that the budget cannot spare when connections are re-established after
    # an outage. The limiter's replies are flat integer arrays, the same in RESP2. redis-py >= 7 names
    # the SETINFO option driver_info.
    base = getattr(redis.connection, "AbstractConnection", Connection)
    if "driver_info" in inspect.signature(base.__init__).parameters:
        return {"protocol": 2, "driver_info": None}
    return {"protocol": 2, "lib_name": None, "lib_version": None}


#: Connection options for no handshake beyond the connect (RESP2, no CLIENT SETINFO).
HANDSHAKE = _no_handshake_options()


# -- the transports' shims ----------------------------------------------------------------------------
def checkout(pool: Any) -> Any:
    """A connection of a sync pool (redis-py 5 wants a command name, which redis-py 6+ deprecates)."""
    try:
        return pool.get_connection()
    except TypeError:
        return pool.get_connection("EVALSHA")


async def acheckout(pool: Any) -> Any:
    """A connection of an asyncio pool (as `checkout`)."""
    try:
        return await pool.get_connection()
    except TypeError:
        return await pool.get_connection("EVALSHA")


def connected(connection: Any) -> bool:
    """True when a sync connection holds a socket (redis-py 8's `is_connected`, which redis-py 5-7 lack)."""
    return connection._sock is not None


def stale(connection: Any) -> bool:
    """True when the server closed this idle sync connection (restart, idle timeout) or it holds stray data."""
    try:
        return bool(connection.can_read())
    except (RedisError, OSError):  # redis-py reports a closed connection by raising
        return True


async def aclosed_or_dirty(connection: Any) -> bool:
    """`stale` for an asyncio connection: `can_read()` (redis-py 8) or `can_read_destructive()` (5 to 7;
    reading is harmless here: such a connection is dropped)."""
    can_read = getattr(connection, "can_read", None) or connection.can_read_destructive
    try:
        return bool(await can_read())
    except REDIS_CLIENT_ERRORS:  # redis-py 5 to 7 report a closed connection by raising
        return True


async def close_client(client: Any) -> None:
    """Close a redis.asyncio client: `aclose()`, or `close()` on redis-py 5.0.0, which lacks it."""
    close = getattr(client, "aclose", None) or client.close
    await close()


# -- connections within the time budget ---------------------------------------------------------------
# A read issued after the budget ran out still gets this long: the command was already sent, and a
# reply that is on its way is worth a millisecond more than an unknown outcome.
_LAST_READ = 0.001

#: redis-py >= 8 accepts read_response(timeout=...); older versions (5.0 to 7.x) read with the socket's
#: own timeout (see BudgetMixin._read_response_within).
_READ_TAKES_TIMEOUT = "timeout" in inspect.signature(Connection.read_response).parameters

#: The share of a socket's own timeout a reply wait may outlast the budget by before the budget is put on
#: the socket for it: a call's first read comes a few microseconds into a budget that its socket timeout
#: equals (the clients' timeouts are clipped to the budget), and two system calls to change the socket's
#: timeout for those microseconds are not worth it.
_OVERRUN_TOLERATED = 0.1


def _overruns(socket_timeout: float | None, left: float) -> bool:
    """True when a reply wait with the socket's own timeout could outlast the budget too much."""
    return socket_timeout is None or left < socket_timeout * (1 - _OVERRUN_TOLERATED)


if TYPE_CHECKING:
    from redis.connection import AbstractConnection as _ConnectionBase
else:
    _ConnectionBase = object


class BudgetMixin(_ConnectionBase):
    """Clips each socket connect and each reply wait to the time left in the current budget (outside one the
    connection behaves like its base class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._configured_connect_timeout: float | None = self.socket_connect_timeout

    def _connect(self) -> Any:
        left = time_left()
        configured = self._configured_connect_timeout
        if left is None:
            self.socket_connect_timeout = configured
        else:
            if left <= 0:
                raise TimeoutError("the limiter's time budget ran out before connecting to Redis")
            self.socket_connect_timeout = left if configured is None else min(configured, left)
        return super()._connect()  # type: ignore[safe-super]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        left = time_left()
        if left is not None and "timeout" not in kwargs and _overruns(self.socket_timeout, left):
            if not _READ_TAKES_TIMEOUT:
                return self._read_response_within(max(left, _LAST_READ), args, kwargs)
            kwargs["timeout"] = max(left, _LAST_READ)
        return super().read_response(*args, **kwargs)

    def _read_response_within(self, timeout: float, args: Any, kwargs: Any) -> Any:
        # redis-py < 8: its parsers read with the socket's own timeout, so the budget goes on the socket
        # for this one reply and the configured timeout comes back after it, as redis-py >= 8 does with
        # read_response(timeout=...).
        sock = self._sock
        if sock is None:
            return super().read_response(*args, **kwargs)  # not connected: fails as redis-py does
        sock.settimeout(timeout)
        try:
            return super().read_response(*args, **kwargs)
        finally:
            if self._sock is sock:  # still connected (a failed read disconnects)
                sock.settimeout(self.socket_timeout)


class BudgetConnection(BudgetMixin, Connection):
    """A TCP connection that respects the limiter's time budget."""


class BudgetSSLConnection(BudgetMixin, SSLConnection):
    """A TLS connection that respects the limiter's time budget."""


class BudgetUnixConnection(BudgetMixin, UnixDomainSocketConnection):
    """A Unix socket connection that respects the limiter's time budget."""


class BudgetSentinelConnection(BudgetMixin, SentinelManagedConnection):
    """A connection to the master the sentinels name, respecting the limiter's time budget."""


_BUDGET_CLASSES: dict[type[Any], type[Any]] = {
    Connection: BudgetConnection,
    SSLConnection: BudgetSSLConnection,
    UnixDomainSocketConnection: BudgetUnixConnection,
}


def budget_class_for(connection_class: type[Any]) -> type[Any] | None:
    """The budget-respecting variant of a redis-py connection class, or None when there is none."""
    if issubclass(connection_class, BudgetMixin):
        return connection_class
    return _BUDGET_CLASSES.get(connection_class)


def async_connection_class(pool: ConnectionPool) -> type[Any] | None:
    """The redis.asyncio connection class that reaches what a sync pool of budget connections reaches
    (TCP, TLS or a Unix socket), or None for another kind of pool."""
    import redis.asyncio.connection as aio

    classes: dict[type[Any], type[Any]] = {
        BudgetConnection: aio.Connection, BudgetSSLConnection: aio.SSLConnection,
        BudgetUnixConnection: aio.UnixDomainSocketConnection,
    }
    return classes.get(pool.connection_class)


class BudgetBlockingConnectionPool(redis.BlockingConnectionPool):
    """A pool of at most `max_connections` whose callers, when every connection is in use, wait for one
    to come back: for at most `timeout` seconds, and never past the running limiter call's budget
    (`time_left()`); then redis.ConnectionError, which the limiter's fail mode answers."""

    @property
    def timeout(self) -> float | None:
        """How long a caller of now may wait for a free connection."""
        left = time_left()
        if left is None:
            return self._wait
        left = max(left, 0.0)
        return left if self._wait is None else min(self._wait, left)

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._wait = value
