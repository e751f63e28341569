"""The synchronous transport of the engine: `RateLimiter` sends the calls of ratelimit_app.engine.

On a standalone Redis each thread keeps its own connection (see `RateLimiter`), so a decision costs
one write and one read, with no pool checkout.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Union, cast

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from .decision import Decision
from .engine import _PREFIX, Check, PreparedCall, parse_reply, prepare_call
from .exceptions import BackendError
from .policies import Policy
from .scripts import decide_sha, decide_source

RedisClient = Union[redis.Redis, RedisCluster]  # noqa: UP007 (a runtime alias, kept readable)
# What a client raises when Redis cannot answer; RedisClusterException ("no node reachable") is not a
# RedisError.
_REDIS_FAILURES = (RedisError, RedisClusterException, OSError)
#: A thread's connection unused for longer than this (seconds) is checked for a server-side close
#: (a restart, an idle timeout) before it is used again, as a pool checkout would; one in back-to-back
#: use skips that system call, which costs about as much as the rest of the client's work.
IDLE_CHECK_AFTER = 0.01


def _stale(connection: Any) -> bool:
    """True when the server closed this idle connection (restart, idle timeout) or it holds stray data."""
    try:
        return bool(connection.can_read())
    except (RedisError, OSError):  # redis-py reports a closed connection by raising
        return True


_forks = 0  # forks this process has come from: a child never writes to a connection of its parent


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


class _Owned:
    """Holds a thread's connection and closes it as soon as it is dropped: when its thread ends (the
    thread's slot of the thread-local is cleared at once), not when a garbage collection finds the
    connection's own reference cycles."""

    __slots__ = ("connection",)

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def __del__(self) -> None:
        try:
            self.connection.disconnect()  # in a forked child this closes only the child's copy
        except Exception:  # noqa: S110 (interpreter shutdown, a socket already gone)
            pass


class _ThreadConnection(threading.local):
    """The connection of one thread (and one process: a forked child makes its own)."""

    owned: _Owned | None = None
    forks: int = 0
    last_used: float = 0.0


class RateLimiter:
    """Decides requests against policies using Redis as the one shared state.

    `client` is a `redis.Redis` or a `redis.cluster.RedisCluster`. Each call makes one round trip
    (EVALSHA of the decision script, plus a SCRIPT LOAD when Redis has lost the script). Redis
    failures raise `BackendError`; a call whose reply is lost after it was sent is never resent,
    because Redis may already have charged it.

    On a standalone Redis (or Sentinel) each thread that decides keeps one connection of its own,
    made from the client's connection settings (its pool's connection class and options) and not
    counted by its pool. A decision is then one write and one read, without a pool checkout. A
    connection idle for more than IDLE_CHECK_AFTER seconds is checked for a server-side close before
    use, as a pool checkout does; a connection that failed is closed and made again on next use.
    """

    def __init__(self, client: RedisClient, prefix: str = "rl") -> None:
        if not isinstance(client, (redis.Redis, RedisCluster)):
            raise TypeError(
                f"client: expected a redis.Redis or redis.cluster.RedisCluster, got {type(client).__name__}"
            )
        if not isinstance(prefix, str) or not _PREFIX.match(prefix):
            raise ValueError(f"prefix: {prefix!r} must be 1-64 characters of letters, digits, '_.:-'")
        self.client = client
        self.prefix = prefix
        self._cluster = isinstance(client, RedisCluster)
        self._thread = _ThreadConnection()

    def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Charge `cost` to every policy if all of them allow it; charge nothing otherwise."""
        return self._run(prepare_call(self.prefix, ((identity, policies),), cost, charge=True))[0]

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Report what `hit` would decide for `cost`, with remaining counted now; charges nothing."""
        return self._run(prepare_call(self.prefix, ((identity, policies),), cost, charge=False))[0]

    def hit_many(self, checks: Sequence[Check], cost: int = 1) -> list[Decision]:
        """Decide several identities together (for example a client IP and its API key).

        On a single Redis this is one round trip and all-or-nothing across every identity. On Redis
        Cluster the identities live on different slots, so they are decided one after another and
        the first denial stops the rest (identities already charged stay charged; the list is then
        shorter than `checks`).
        """
        if self._cluster and len(checks) > 1:
            decisions: list[Decision] = []
            for check in checks:
                decision = self._run(prepare_call(self.prefix, (check,), cost, charge=True))[0]
                decisions.append(decision)
                if not decision.allowed:
                    break
            return decisions
        return self._run(prepare_call(self.prefix, checks, cost, charge=True))

    def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies."""
        keys = self.keys(identity, policies)
        if keys:
            try:
                self.client.delete(*keys)
            except _REDIS_FAILURES as exc:
                raise BackendError(f"could not reset {identity!r:.80}: {exc}", maybe_applied=True) from exc

    def keys(self, identity: str, policies: Sequence[Policy]) -> list[str]:
        """The Redis keys that hold the state of `identity` under these policies."""
        return prepare_call(self.prefix, ((identity, policies),), 1, charge=False).keys

    def close(self) -> None:
        """Close this thread's connection (other threads' connections close when their thread ends)."""
        owned = self._thread.owned
        self._thread.owned = None
        if owned is not None:
            owned.connection.disconnect()

    def _run(self, call: PreparedCall) -> list[Decision]:
        if not call.plan.key_count:
            return [Decision.from_results(()) for _ in call.digests]
        try:
            reply = self._send(call)
        except NoScriptError:
            # Redis lost its script cache (restart, failover, SCRIPT FLUSH). NOSCRIPT means nothing ran,
            # so loading the script and sending once more cannot charge twice.
            try:
                self.client.script_load(decide_source())
            except _REDIS_FAILURES as exc:
                raise BackendError(f"could not load the decision script: {exc}", maybe_applied=False) from exc
            reply = self._send(call)
        return parse_reply(call, reply)

    def _connection(self) -> Any:
        """This thread's connection, made on first use (and again after a fork or a failure)."""
        thread = self._thread
        owned = thread.owned
        now = time.monotonic()
        if owned is None or thread.forks != _forks:
            pool = cast(redis.Redis, self.client).connection_pool
            connection = pool.connection_class(**pool.connection_kwargs)
            thread.owned, thread.forks = _Owned(connection), _forks
        else:
            connection = owned.connection
            if now - thread.last_used > IDLE_CHECK_AFTER and connection.is_connected and _stale(connection):
                connection.disconnect()  # connected again before anything is sent
        thread.last_used = now
        return connection

    def _send(self, call: PreparedCall) -> Any:
        if self._cluster:
            try:
                return self.client.execute_command("EVALSHA", decide_sha(), call.plan.key_count, *call.keys,
                                                   *call.plan.args)
            except NoScriptError:
                raise
            except _REDIS_FAILURES as exc:
                raise BackendError(f"Redis Cluster failed: {exc}", maybe_applied=True) from exc
        # Standalone: write to this thread's own connection, so a client configured with retries can
        # never resend an EVALSHA whose reply was lost (Redis may already have charged it).
        sent = False
        try:
            connection = self._connection()
            if not connection.is_connected:
                connection.connect()
        except (RedisError, OSError) as exc:
            self.close()
            raise BackendError(f"Redis unreachable: {exc}", maybe_applied=False) from exc
        try:
            connection.send_packed_command((call.packed,))
            sent = True
            return connection.read_response()
        except NoScriptError:
            raise
        except (RedisError, OSError) as exc:
            if not isinstance(exc, redis.ResponseError):
                self.close()  # the connection's state is unknown: never reuse it
            raise BackendError(f"Redis failed: {exc}", maybe_applied=sent) from exc
