"""The asyncio transport of the engine: `AsyncRateLimiter` carries out the steps of ratelimit_app.core.engine.

Everything but the I/O is shared with the sync `RateLimiter`: the call (`prepare_call`), the exchange
(`decision_steps`: NOSCRIPT recovery, the never-resend rule, one call per slot on a cluster) and the reply
(`parse_reply`). So the two return the same `Decision` for the same state, and fail the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Union, cast

import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.client import NEVER_DECODE
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .budget import time_left
from .decision import Decision
from .engine import NOSCRIPT, Check, PreparedCall, Steps, check_prefix, decision_steps, release_keys, state_keys
from .exceptions import REDIS_CLIENT_ERRORS, BackendError
from .policies import Policy
from .scripts import decide_sha, decide_source

AsyncRedisClient = Union[redis.asyncio.Redis, AsyncRedisCluster]  # noqa: UP007 (a runtime alias)


#: The values of AsyncRateLimiter's `connections`.
ASYNC_CONNECTION_MODES = ("own", "pool")


async def close_client(client: Any) -> None:
    """Close a redis.asyncio client: `aclose()`, or `close()` on redis-py 5.0.0, which lacks it."""
    close = getattr(client, "aclose", None) or client.close
    await close()


async def _checkout(pool: Any) -> Any:
    """A connection of an asyncio pool (redis-py 5 wants a command name, which redis-py 6+ deprecates)."""
    try:
        return await pool.get_connection()
    except TypeError:
        return await pool.get_connection("EVALSHA")


async def _closed_or_dirty(connection: Any) -> bool:
    """True when the server closed this idle connection or left bytes on it: `can_read()` (redis-py 8)
    or `can_read_destructive()` (5 to 7; reading is harmless here: such a connection is dropped)."""
    can_read = getattr(connection, "can_read", None) or connection.can_read_destructive
    try:
        return bool(await can_read())
    except REDIS_CLIENT_ERRORS:  # redis-py 5 to 7 report a closed connection by raising
        return True


class AsyncRateLimiter:
    """Decides requests against policies, like `RateLimiter`, from asyncio code.

    `client` is a `redis.asyncio.Redis` or a `redis.asyncio.cluster.RedisCluster`, used from the event
    loop it belongs to. Each call makes one round trip (EVALSHA of the decision script, plus a SCRIPT
    LOAD when Redis has lost the script). Redis failures raise `BackendError`; a call whose reply is
    lost after it was sent is never resent, because Redis may already have charged it: the client's
    own retries are bypassed (the EVALSHA is written on one connection exactly once, or sent to one
    named cluster node). A call cancelled while it waits for Redis (a timeout around it) closes the
    connection it used, so no later call reads its reply.

    `connections` chooses how a standalone Redis (or Sentinel master) is reached. "own" (the default,
    the speed path): the limiter keeps connections of its own, made with the client's connection
    class and options but not taken from its pool, one per decision in flight and at most the pool's
    `max_connections`; a decision is one write of the packed command and one read, with no pool
    checkout. A connection the server closed (a restart, an idle timeout) is replaced before use.
    "pool" (the reference path): each decision checks a connection out of the client's pool and
    sends the EVALSHA with redis-py's `send_command`. On Redis Cluster both use the client's node
    pools. `aclose()` closes the limiter's own connections (not the client).
    """

    def __init__(self, client: AsyncRedisClient, prefix: str = "rl", *, connections: str = "own") -> None:
        if not isinstance(client, (redis.asyncio.Redis, AsyncRedisCluster)):
            raise TypeError(
                "client: expected a redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster, "
                f"got {type(client).__name__}"
            )
        if connections not in ASYNC_CONNECTION_MODES:
            raise ValueError(f"connections: {connections!r} is not one of {', '.join(ASYNC_CONNECTION_MODES)}")
        self.client = client
        self.prefix = check_prefix(prefix)
        self.connections = connections
        self._cluster = isinstance(client, AsyncRedisCluster)
        self._send = (self._send_cluster if self._cluster
                      else self._send_pooled if connections == "pool" else self._send_own)
        self._idle: list[Any] = []  # own connections not in use, most recently used last
        self._read_timeout: float | None = None
        self._slots: asyncio.Semaphore | None = None
        if not self._cluster and connections == "own":
            pool = cast(redis.asyncio.Redis, client).connection_pool
            self._read_timeout = pool.connection_kwargs.get("socket_timeout")
            limit = getattr(pool, "max_connections", None)
            if isinstance(limit, int) and limit < 2**31 - 1:  # redis-py's "no limit" is 2**31 - 1
                self._slots = asyncio.Semaphore(limit)

    async def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
                  lease: str | None = None) -> Decision:
        """Charge `cost` to every policy if all of them allow it; charge nothing otherwise. A concurrency
        policy takes one slot, held under `lease` (required then) until `release` or the lease period."""
        return (await self._run(decision_steps(self.prefix, ((identity, policies),), cost, charge=True,
                                       one_slot_per_call=False, lease=lease)))[0]

    async def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Report what `hit` would decide for `cost`, with remaining counted now; charges nothing."""
        return (await self._run(decision_steps(self.prefix, ((identity, policies),), cost, charge=False,
                                       one_slot_per_call=False)))[0]

    async def hit_many(self, checks: Sequence[Check], cost: int = 1, *,
                       lease: str | None = None) -> list[Decision]:
        """Decide several identities together; all-or-nothing on a single Redis, one after another on
        Redis Cluster (see `RateLimiter.hit_many`). `lease` as in `hit`."""
        return await self._run(decision_steps(self.prefix, checks, cost, charge=True, one_slot_per_call=self._cluster,
                                      lease=lease))

    async def release(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Give back the concurrency slots held under `lease` (see `RateLimiter.release`): one round
        trip on a single Redis (a non-transactional pipeline of one ZREM per slot), one ZREM per slot
        on Redis Cluster. Raises BackendError when Redis cannot be asked."""
        keys = release_keys(self.prefix, held)
        if not keys:
            return
        try:
            if self._cluster:
                for key in keys:  # the identities may live on different nodes
                    await self.client.zrem(key, lease)
                return
            async with cast(redis.asyncio.Redis, self.client).pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.zrem(key, lease)
                await pipe.execute()
        except REDIS_CLIENT_ERRORS as exc:
            raise BackendError(f"could not release slots of lease {lease!r}: {exc}", maybe_applied=True) from exc

    async def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies (one call of the decision script: the
        identity's other policies, which share its key, keep theirs)."""
        if policies:
            await self._run(decision_steps(self.prefix, ((identity, policies),), 1, charge=False,
                                           one_slot_per_call=False, reset=True))

    def keys(self, identity: str, policies: Sequence[Policy]) -> list[str]:
        """The Redis keys that hold the state of `identity` under these policies."""
        return state_keys(self.prefix, identity, policies)

    async def _run(self, steps: Steps) -> list[Decision]:
        """Carry out the steps of one decision (see ratelimit_app.core.engine)."""
        reply: Any = None
        try:
            while True:
                call = steps.send(reply)
                if call is None:
                    await self._load_script()
                    reply = None
                else:
                    reply = await self._send(call)
        except StopIteration as done:
            return done.value

    async def _load_script(self) -> None:
        try:
            await self.client.script_load(decide_source())
        except REDIS_CLIENT_ERRORS as exc:
            raise BackendError(f"could not load the decision script: {exc}", maybe_applied=False) from exc

    async def aclose(self) -> None:
        """Close the limiter's own idle connections (the client, and its pool, stay open). A decision in
        flight puts its connection back when it ends; the limiter stays usable and reconnects as needed."""
        idle = self._idle
        while idle:
            await idle.pop().disconnect()

    async def _send_own(self, call: PreparedCall) -> Any:
        """The speed path: the packed command on a connection of the limiter's own."""
        slots = self._slots
        if slots is not None:
            await slots.acquire()
        idle = self._idle
        if idle:
            connection = idle.pop()
        else:
            # With a socket timeout, redis-py wraps every write in asyncio.wait_for, which before Python
            # 3.12 starts a task and costs a turn of the event loop per command. A write here never
            # waits (one command in flight per connection: the transport's buffer cannot fill), so the
            # limiter's own connections have none, and the reply wait gets the client's socket timeout
            # explicitly (see _write_and_read).
            pool = cast(redis.asyncio.Redis, self.client).connection_pool
            connection = pool.connection_class(**{**pool.connection_kwargs, "socket_timeout": None})
        try:
            try:
                # can_read() only looks at what the event loop already received: True means the server
                # closed this connection while it was idle, or left bytes on it; either way, replace it
                if connection.is_connected and await _closed_or_dirty(connection):
                    await connection.disconnect()
                if not connection.is_connected:
                    await connection.connect()
            except REDIS_CLIENT_ERRORS as exc:
                await connection.disconnect()
                raise BackendError(f"Redis unreachable: {exc}", maybe_applied=False) from exc
            except BaseException:  # cancelled while connecting: never reuse a half-made connection
                await connection.disconnect(nowait=True)
                raise
            return await self._write_and_read(connection, call, read_timeout=self._reply_timeout())
        finally:
            idle.append(connection)
            if slots is not None:
                slots.release()

    def _reply_timeout(self) -> float | None:
        """How long an own connection waits for a reply: the client's socket timeout, or None (no timer
        of its own) when the caller's time budget (`time_left()`, set by the async service around its
        own timeout) runs out first anyway: one timer per decision instead of two."""
        read_timeout = self._read_timeout
        if read_timeout is not None:
            left = time_left()
            if left is not None and left <= read_timeout:
                return None
        return read_timeout

    async def _send_pooled(self, call: PreparedCall) -> Any:
        """The reference path: a connection of the client's pool, redis-py's own command packing."""
        pool = cast(redis.asyncio.Redis, self.client).connection_pool
        try:
            connection = await _checkout(pool)
        except REDIS_CLIENT_ERRORS as exc:
            raise BackendError(f"Redis unreachable: {exc}", maybe_applied=False) from exc
        try:
            return await self._write_and_read(connection, call, packed=False)
        finally:
            # a cancelled write or read has already closed the connection (redis-py does on any
            # BaseException), so what goes back to the pool is clean or closed
            await pool.release(connection)

    async def _write_and_read(self, connection: Any, call: PreparedCall, packed: bool = True,
                              read_timeout: float | None = None) -> Any:
        """Write the call once on `connection` and read its reply (waiting at most `read_timeout`
        seconds when given, else the connection's own socket timeout)."""
        sent = False
        try:
            if packed:
                await connection.send_packed_command(call.packed, False)
            else:
                await connection.send_command("EVALSHA", decide_sha(), call.plan.key_count, *call.keys,
                                              *call.args)
            sent = True
            if read_timeout is None:
                return await connection.read_response(disable_decoding=True)  # the reply is binary
            reply = await connection.read_response(disable_decoding=True, timeout=read_timeout)
            if reply is None:  # redis-py's answer to a read that timed out (the script never returns nil)
                raise RedisTimeoutError(f"no reply from Redis within {read_timeout} s")
            return reply
        except NoScriptError:
            return NOSCRIPT
        except REDIS_CLIENT_ERRORS as exc:
            if not isinstance(exc, ResponseError):
                await connection.disconnect()  # the connection's state is unknown: never reuse it
            raise BackendError(f"Redis failed: {exc}", maybe_applied=sent) from exc

    async def _send_cluster(self, call: PreparedCall) -> Any:
        """To the node that owns the call's slot: naming the node turns off the cluster client's
        retries (a MOVED or ASK redirection, which means nothing ran, is still followed)."""
        client = cast(AsyncRedisCluster, self.client)
        keys = call.keys
        try:
            await client.initialize()  # learns the slots on first use, and again after a failure
            node = client.get_node_from_key(keys[0])
        except REDIS_CLIENT_ERRORS as exc:
            raise BackendError(f"Redis Cluster failed: {exc}", maybe_applied=False) from exc
        try:
            return await client.execute_command("EVALSHA", decide_sha(), call.plan.key_count, *keys,
                                                *call.args, target_nodes=node,
                                                **{NEVER_DECODE: True})  # the reply is binary
        except NoScriptError:
            return NOSCRIPT
        except REDIS_CLIENT_ERRORS as exc:
            raise BackendError(f"Redis Cluster failed: {exc}", maybe_applied=True) from exc
