"""The synchronous transport of the engine: `RateLimiter` carries out the steps of ratelimit_app.core.engine over
a redis-py client (the twin of engine_async.AsyncRateLimiter). A standalone Redis is reached over "own"
connections (the speed path: one per thread, one write and one read, no pool checkout) or the client's
"pool" (connections within `max_connections` under gevent or eventlet, whose thread-locals are per
greenlet); "auto" picks "pool" when gevent or eventlet has patched threading, "own" otherwise."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, Union, cast

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from . import engine, leases
from .decision import Decision
from .engine import LOAD_SCRIPT, NOSCRIPT, Check, PreparedCall, Steps
from .exceptions import REDIS_CLIENT_ERRORS
from .keys import check_prefix, state_keys
from .policies import Policy
from .redispy import BINARY_REPLY, checkout, connected, stale
from .scripts import decide_source
from .usage import Reservation, charged, reservation, settle, usage_pairs

RedisClient = Union[redis.Redis, RedisCluster]  # noqa: UP007 (a runtime alias, kept readable)
#: A thread's connection unused for longer than this (seconds) is checked for a server-side close
#: (a restart, an idle timeout) before it is used again, as a pool checkout would; one in back-to-back
#: use skips that system call, which costs about as much as the rest of the client's work.
IDLE_CHECK_AFTER = 0.01
T = TypeVar("T")


def green_threads() -> bool:
    """True when gevent or eventlet has monkey-patched threading: thread-locals are then per greenlet."""
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("threading"):
        return True
    eventlet_patcher = sys.modules.get("eventlet.patcher")
    return eventlet_patcher is not None and bool(eventlet_patcher.is_monkey_patched("thread"))


def resolve_connections(connections: str) -> str:
    """"own" or "pool" for a `connections` value (see the module docstring); ValueError otherwise."""
    if engine.check_connections(connections) == "auto":
        return "pool" if green_threads() else "own"
    return connections


def _zrem_each(connection: Any, keys: list[str], lease: str) -> None:
    """Remove `lease` from each key, pipelined on `connection`: one write, then the replies. A failure
    closes the connection (its state is unknown) and raises BackendError."""
    try:
        connection.send_packed_command(connection.pack_commands([("ZREM", key, lease) for key in keys]))
        for _ in keys:
            connection.read_response()
    except REDIS_CLIENT_ERRORS as exc:
        connection.disconnect()
        raise engine.release_failed(lease, exc) from exc


_forks = 0  # forks this process has come from: a child never writes to a connection of its parent


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


MAX_SHELVED = 64  # the most idle connections a limiter keeps for new threads (see `_Owned`)


class _Owned:
    """Holds a thread's connection and lets go of it as soon as it is dropped: when its thread ends (its
    slot of the thread-local is cleared at once), not when a garbage collection finds its reference cycles.
    A connection let go of goes on its limiter's shelf for the next new thread, so servers that run each
    request in a thread of its own (Django's ASGI handler, for sync code) reuse a few connections; beyond
    MAX_SHELVED, or in a forked child (whose copy of a parent's connection is never written to), it is closed.
    """

    __slots__ = ("connection", "forks", "shelf")

    def __init__(self, connection: Any, shelf: list[tuple[Any, int]]) -> None:
        self.connection = connection
        self.forks = _forks
        self.shelf = shelf

    def __del__(self) -> None:
        try:
            if self.forks == _forks and len(self.shelf) < MAX_SHELVED:
                self.shelf.append((self.connection, self.forks))  # list.append is atomic
            else:
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

    `client` is a `redis.Redis` or a `redis.cluster.RedisCluster`. Each call makes one round trip (EVALSHA
    of the decision script, plus a SCRIPT LOAD when Redis lost it). Redis failures raise `BackendError`; a
    call whose reply is lost after it was sent is never resent, as Redis may have charged it. With "own"
    `connections`, a thread's connection idle for over IDLE_CHECK_AFTER seconds is checked for a
    server-side close before use; one that failed is closed and made again on next use.
    """


    def __init__(self, client: RedisClient, prefix: str = "rl", *, connections: str = "auto") -> None:
        self.client = engine.check_client(client, (redis.Redis, RedisCluster),
                                          "redis.Redis or redis.cluster.RedisCluster")
        self.prefix = check_prefix(prefix)
        #: "own" or "pool": how this limiter reaches a standalone Redis
        self.connections = resolve_connections(connections)
        self._cluster = isinstance(client, RedisCluster)
        self._send, self._release = (
            (self._send_cluster, self._release_cluster) if self._cluster
            else (self._send_pooled, self._release_pooled) if self.connections == "pool"
            else (self._send_own, self._release_own))
        self._thread = _ThreadConnection()
        #: idle connections of threads that ended, with the fork count they were made under
        self._shelf: list[tuple[Any, int]] = []

    def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1, *, lease: str | None = None,
            clock_shift_ms: int = 0) -> Decision:
        """Charge `cost` to every policy if all of them allow it; charge nothing otherwise. A concurrency
        policy takes one slot, held under `lease` (required then) until `release` or the lease period.
        `clock_shift_ms` decides as if Redis' clock were that much later (tests only: the test kit's
        `advance`)."""
        return self._run(engine.hit_steps(self.prefix, identity, policies, cost, lease, clock_shift_ms))

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1, *, clock_shift_ms: int = 0) -> Decision:
        """Report what `hit` would decide for `cost`, with remaining counted now; charges nothing."""
        return self._run(engine.peek_steps(self.prefix, identity, policies, cost, clock_shift_ms))

    def hit_many(self, checks: Sequence[Check], cost: int = 1, *, lease: str | None = None,
                 clock_shift_ms: int = 0, usage: engine.Usage = ()) -> list[Decision]:
        """Decide several identities together (a client IP and its API key): one all-or-nothing round trip on
        a single Redis; on Redis Cluster one call per identity, in order, the first denial stopping the rest
        (those already charged stay charged, the list is shorter). `lease`, `clock_shift_ms` as in `hit`."""
        steps = engine.decision_steps(self.prefix, checks, cost, charge=True, one_slot_per_call=self._cluster,
                                      lease=lease, shift=clock_shift_ms, usage=usage)
        return self._run(steps)

    def reserve(self, identity: str, policies: Sequence[Policy], usage: Mapping[str, int], cost: int = 1, *,
                lease: str | None = None, clock_shift_ms: int = 0) -> tuple[Decision, Reservation]:
        """`hit`, each usage limit (a policy with a unit) charged the estimate of its unit in `usage` ({"tokens":
        500}; one of a unit not named is left out); the Reservation is what `settle` needs (empty if refused)."""
        started, pairs = time.monotonic(), usage_pairs(usage)
        checks = [(identity, charged(policies, pairs))]
        decisions = self.hit_many(checks, cost, lease=lease, clock_shift_ms=clock_shift_ms, usage=pairs)
        return decisions[0], reservation(self.prefix, checks, pairs, started, clock_shift_ms, decisions)

    def settle(self, reservation: Reservation, used: Mapping[str, int]) -> int:
        """Settle a reservation at the units `used` ({"tokens": 120}): each estimate's unused part given back, an
        overrun charged (lua/settle.lua, one call per identity); how many changed. BackendError if Redis fails."""
        return settle(self.client, reservation, used)

    def release(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Give back the concurrency slots held under `lease`: each (identity, concurrency policy) of
        `held`. One round trip on a single Redis (one ZREM per slot, pipelined), on the same path as a
        decision (this thread's connection, or one of the pool); one ZREM per slot on Redis Cluster. A
        slot already freed (its lease ran out) is left alone. Raises BackendError when Redis cannot be
        asked (the slots then free themselves when their lease runs out)."""
        keys = engine.release_plan(self.prefix, held, lease)
        if keys:
            self._release(keys, lease)

    def cancel(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Make sure `lease` holds none of the slots of `held`, now or later: for a decision whose reply
        was lost, which Redis may have run, or may run later still (lua/cancel.lua): a slot it took is
        given back, a charge under this token that runs afterwards takes nothing. One EVAL per slot
        (running one again changes nothing). Raises BackendError when Redis cannot be asked."""
        leases.cancel(self.client, self.prefix, held, lease)

    def renew(self, held: Sequence[tuple[str, Policy]], lease: str, lease_ms: int | None = None) -> int:
        """Make the live slots of `held` under `lease` end `lease_ms` from now (at most each policy's period;
        None: a full period from now); how many were live (lua/renew.lua: a slot given back, cancelled or
        run out stays so). One EVAL per identity. Raises BackendError when Redis cannot be asked."""
        return leases.renew(self.client, self.prefix, held, lease, lease_ms)

    def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies (one call of the decision script: the
        identity's other policies, which share its key, keep theirs)."""
        self._run(engine.reset_steps(self.prefix, identity, policies))

    def keys(self, identity: str, policies: Sequence[Policy]) -> list[str]:
        """The Redis keys that hold the state of `identity` under these policies."""
        return state_keys(self.prefix, identity, policies)

    def close(self) -> None:
        """Close this thread's connection and the idle ones kept for new threads (other threads'
        connections are kept or closed when their thread ends)."""
        owned = self._thread.owned
        self._thread.owned = None
        if owned is not None:
            owned.forks = -1  # not shelved: closed here
            owned.connection.disconnect()
        while self._shelf:
            connection, forks = self._shelf.pop()
            if forks == _forks:
                connection.disconnect()

    # -- the I/O of the steps (see ratelimit_app.core.engine) --------------------------------------------
    def _run(self, steps: Steps[T]) -> T:
        """Carry out the steps of one operation; what they return."""
        reply: Any = None
        try:
            while True:
                call = steps.send(reply)
                if call is LOAD_SCRIPT:
                    self._load_script()
                    reply = None
                else:
                    reply = self._send(call)
        except StopIteration as done:
            return cast(T, done.value)

    def _load_script(self) -> None:
        try:
            self.client.script_load(decide_source())
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.load_failed(exc) from exc

    def _send_cluster(self, call: PreparedCall) -> Any:
        """To the node that owns the call's slot, through the cluster client: naming the node turns
        off the client's retries (a MOVED or ASK redirection, which means nothing ran, is still followed)."""
        client = cast(RedisCluster, self.client)
        try:
            node = client.get_node_from_key(call.keys[0])
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.unreachable(exc) from exc
        try:
            return client.execute_command(*call.command(), target_nodes=node,
                                          **BINARY_REPLY)
        except NoScriptError:
            return NOSCRIPT
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.failed(exc, sent=True) from exc

    def _send_pooled(self, call: PreparedCall) -> Any:
        """The reference path: a connection of the client's pool, redis-py's own command packing."""
        pool = cast(redis.Redis, self.client).connection_pool
        try:
            connection = checkout(pool)
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.unreachable(exc) from exc
        try:
            return self._write_and_read(connection, call, packed=False)
        finally:
            pool.release(connection)

    def _send_own(self, call: PreparedCall) -> Any:
        """The speed path: the packed command on this thread's own connection (so a client configured
        with retries can never resend an EVALSHA whose reply was lost)."""
        try:
            connection = self._connected_own()
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.unreachable(exc) from exc
        return self._write_and_read(connection, call)

    def _write_and_read(self, connection: Any, call: PreparedCall, packed: bool = True) -> Any:
        """Write the call once on `connection` and read its reply; a connection whose state is unknown
        after a failure is closed (made again on next use)."""
        sent = False
        try:
            if packed:
                connection.send_packed_command((call.packed,))
            else:
                connection.send_command(*call.command())
            sent = True
            return connection.read_response(disable_decoding=True)  # the reply is binary
        except NoScriptError:
            return NOSCRIPT
        except REDIS_CLIENT_ERRORS as exc:
            if not isinstance(exc, ResponseError):
                connection.disconnect()
            raise engine.failed(exc, sent) from exc

    def _release_cluster(self, keys: list[str], lease: str) -> None:
        """One ZREM per slot: the identities may live on different nodes."""
        try:
            for key in keys:
                self.client.zrem(key, lease)
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.release_failed(lease, exc) from exc

    def _release_pooled(self, keys: list[str], lease: str) -> None:
        """The ZREMs, pipelined on a connection of the client's pool."""
        pool = cast(redis.Redis, self.client).connection_pool
        try:
            connection = checkout(pool)
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.release_failed(lease, exc, sent=False) from exc
        try:
            _zrem_each(connection, keys, lease)
        finally:
            pool.release(connection)

    def _release_own(self, keys: list[str], lease: str) -> None:
        """The ZREMs, pipelined on this thread's own connection."""
        try:
            connection = self._connected_own()
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.release_failed(lease, exc, sent=False) from exc
        _zrem_each(connection, keys, lease)

    # -- the per-thread connections of the speed path ---------------------------------------------------
    def _connected_own(self) -> Any:
        """This thread's connection, made on first use (and again after a fork or a failure), connected (a
        connection that fails to connect is closed, and redis-py's error raised)."""
        thread = self._thread
        owned = thread.owned
        now = time.monotonic()
        if owned is None or thread.forks != _forks:
            connection = self._new_thread_connection()
            thread.owned, thread.forks = _Owned(connection, self._shelf), _forks
            if connected(connection) and stale(connection):
                connection.disconnect()  # a shelved connection the server closed meanwhile
        else:
            connection = owned.connection
            if now - thread.last_used > IDLE_CHECK_AFTER and connected(connection) and stale(connection):
                connection.disconnect()  # connected again before anything is sent
        thread.last_used = now
        try:
            if not connected(connection):
                connection.connect()
        except REDIS_CLIENT_ERRORS:
            connection.disconnect()
            raise
        return connection

    def _new_thread_connection(self) -> Any:
        """An idle connection a thread that ended left on the shelf, else a new one (made with the
        client pool's connection class and options)."""
        while self._shelf:
            try:
                connection, forks = self._shelf.pop()
            except IndexError:  # another thread took the last one
                break
            if forks == _forks:
                return connection
        pool = cast(redis.Redis, self.client).connection_pool
        return pool.connection_class(**pool.connection_kwargs)
