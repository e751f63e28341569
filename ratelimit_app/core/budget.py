"""Redis connections that respect the limiter's time budget.

While a budget is running (`within_budget`, entered by the services around each call), every connect
and every read of these connections waits at most for the time left in it, so no sequence of steps
inside one decision (connect, handshake, EVALSHA, SCRIPT LOAD, a Sentinel lookup, a cluster topology
refresh) can add up past RATELIMIT['BUDGET_MS']. The clients of ratelimit_app.service.connection and
ratelimit_app.service.sentinel are built with them.
"""

from __future__ import annotations

import inspect
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection

# The monotonic time (time.monotonic()) by which the running limiter call must be answered, or None
# outside a budget. Set by the services around each call (`within_budget`) and read by the connection
# classes below, the pool of ratelimit_app.service.connection and AsyncRateLimiter (`time_left`).
_deadline: ContextVar[float | None] = ContextVar("ratelimit_budget_deadline", default=None)


class within_budget:
    """`with within_budget(seconds):` every Redis connect and reply wait inside waits at most for what is
    left of `seconds` (from `start`, a time.monotonic() value, default now). Nested budgets are not
    combined: the inner one applies until it ends."""

    __slots__ = ("_deadline", "_token")

    def __init__(self, seconds: float, start: float | None = None) -> None:
        self._deadline = (time.monotonic() if start is None else start) + seconds

    def __enter__(self) -> None:
        self._token = _deadline.set(self._deadline)

    def __exit__(self, *exc: object) -> None:
        _deadline.reset(self._token)


def time_left() -> float | None:
    """Seconds left in the running budget (<= 0 once it ran out), or None outside a budget."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


# A read issued after the budget ran out still gets this long: the command was already sent, and a
# reply that is on its way is worth a millisecond more than an unknown outcome.
_LAST_READ = 0.001

#: redis-py >= 8 accepts read_response(timeout=...); older versions (5.0 to 7.x) read with the socket's
#: own timeout (see BudgetMixin._read_response_within).
_READ_TAKES_TIMEOUT = "timeout" in inspect.signature(Connection.read_response).parameters

def reply_wait(read_timeout: float | None) -> float | None:
    """How long a connection without a socket timeout of its own (AsyncRateLimiter's own connections)
    waits for a reply: `read_timeout`, or None, no timer of its own, when the running budget ends first
    anyway (the async service's timeout around the call ends the wait): one timer per decision, not two."""
    if read_timeout is not None:
        left = time_left()
        if left is not None and left <= read_timeout:
            return None
    return read_timeout


#: The share of a socket's own timeout a reply wait may outlast the budget by before the budget is put on
#: the socket for it: a call's first read comes a few microseconds into a budget that its socket timeout
#: equals (the clients' timeouts are clipped to the budget), and two system calls to change the socket's
#: timeout for those microseconds are not worth it.
_OVERRUN_TOLERATED = 0.1


def _overruns(socket_timeout: float | None, left: float) -> bool:
    """True when a reply wait with the socket's own timeout could outlast the budget by more than
    _OVERRUN_TOLERATED of that timeout (always when the socket has none)."""
    return socket_timeout is None or left < socket_timeout * (1 - _OVERRUN_TOLERATED)


if TYPE_CHECKING:
    from redis.connection import AbstractConnection as _ConnectionBase
else:
    _ConnectionBase = object


class BudgetMixin(_ConnectionBase):
    """Clips each socket connect and each reply wait to the time left in the current budget.

    Outside a budget (`time_left()` is None) the connection behaves exactly like its base class.
    """

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
