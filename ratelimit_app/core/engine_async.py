"""The asyncio transport of the engine: `AsyncRateLimiter` carries out the steps of ratelimit_app.core.engine over
a redis.asyncio client (the twin of engine_sync.RateLimiter: the same methods in the same order, the same
Decision for the same state, the same failures).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, Union, cast

import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import engine, leases
from .budget import reply_wait
from .decision import Decision
from .engine import LOAD_SCRIPT, NOSCRIPT, Check, PreparedCall, Steps
from .exceptions import REDIS_CLIENT_ERRORS
from .keys import check_prefix, state_keys
from .policies import Policy
from .redispy import BINARY_REPLY, acheckout, aclosed_or_dirty
from .scripts import decide_source
from .usage import Reservation, asettle, charged, reservation, usage_pairs

AsyncRedisClient = Union[redis.asyncio.Redis, AsyncRedisCluster]  # noqa: UP007 (a runtime alias)
T = TypeVar("T")


class AsyncRateLimiter:
    """Decides requests against policies, like `RateLimiter` (the same calls, failures and `connections`
    modes), from asyncio code, on the event loop `client` (a `redis.asyncio.Redis` or `RedisCluster`)
    belongs to. A call cancelled while it waits for Redis closes the connection it used, so no later call
    reads its reply. With "own" (what "auto" takes) the limiter keeps connections of its own, one per
    decision in flight and at most the pool's `max_connections`; releases of slots go through the
    client's pool in both modes. `aclose()` closes the limiter's own connections (not the client).
    """


    def __init__(self, client: AsyncRedisClient, prefix: str = "rl", *, connections: str = "auto") -> None:
        self.client = engine.check_client(client, (redis.asyncio.Redis, AsyncRedisCluster),
                                   "redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster")
        self.prefix = check_prefix(prefix)
        #: "own" or "pool": how this limiter reaches a standalone Redis
        self.connections = "own" if engine.check_connections(connections) == "auto" else connections
        self._cluster = isinstance(client, AsyncRedisCluster)
        self._send, self._release = (
            (self._send_cluster, self._release_cluster) if self._cluster
            else (self._send_pooled, self._release_pooled) if self.connections == "pool"
            else (self._send_own, self._release_pooled))
        self._idle: list[Any] = []  # own connections not in use, most recently used last
        self._read_timeout: float | None = None
        self._slots: asyncio.Semaphore | None = None
        if not self._cluster and self.connections == "own":
            pool = cast(redis.asyncio.Redis, client).connection_pool
            self._read_timeout = pool.connection_kwargs.get("socket_timeout")
            limit = getattr(pool, "max_connections", None)
            if isinstance(limit, int) and limit < 2**31 - 1:  # redis-py's "no limit" is 2**31 - 1
                self._slots = asyncio.Semaphore(limit)

    async def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
                  lease: str | None = None, clock_shift_ms: int = 0) -> Decision:
        """Charge `cost` to every policy if all of them allow it; charge nothing otherwise. A concurrency
        policy takes one slot, held under `lease` (required then) until `release` or the lease period.
        `clock_shift_ms` as in `RateLimiter.hit` (tests only)."""
        return await self._run(engine.hit_steps(self.prefix, identity, policies, cost, lease, clock_shift_ms))

    async def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1, *,
                   clock_shift_ms: int = 0) -> Decision:
        """Report what `hit` would decide for `cost`, with remaining counted now; charges nothing."""
        return await self._run(engine.peek_steps(self.prefix, identity, policies, cost, clock_shift_ms))

    async def hit_many(self, checks: Sequence[Check], cost: int = 1, *, lease: str | None = None,
                       clock_shift_ms: int = 0, usage: engine.Usage = ()) -> list[Decision]:
        """Decide several identities together; all-or-nothing on a single Redis, one after another on
        Redis Cluster (see `RateLimiter.hit_many`). `lease` and `clock_shift_ms` as in `hit`."""
        steps = engine.decision_steps(self.prefix, checks, cost, charge=True, one_slot_per_call=self._cluster,
                                      lease=lease, shift=clock_shift_ms, usage=usage)
        return await self._run(steps)

    async def reserve(self, identity: str, policies: Sequence[Policy], usage: Mapping[str, int], cost: int = 1, *,
                      lease: str | None = None, clock_shift_ms: int = 0) -> tuple[Decision, Reservation]:
        """`hit`, charging each usage limit the estimate of its unit in `usage` (see `RateLimiter.reserve`)."""
        started, pairs = time.monotonic(), usage_pairs(usage)
        checks = [(identity, charged(policies, pairs))]
        decisions = await self.hit_many(checks, cost, lease=lease, clock_shift_ms=clock_shift_ms, usage=pairs)
        return decisions[0], reservation(self.prefix, checks, pairs, started, clock_shift_ms, decisions)

    async def settle(self, reservation: Reservation, used: Mapping[str, int]) -> int:
        """Settle a reservation at the units `used` (see `RateLimiter.settle`)."""
        return await asettle(self.client, reservation, used)

    async def release(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Give back the concurrency slots held under `lease` (see `RateLimiter.release`): one round
        trip on a single Redis (a non-transactional pipeline of one ZREM per slot), one ZREM per slot
        on Redis Cluster. Raises BackendError when Redis cannot be asked."""
        keys = engine.release_plan(self.prefix, held, lease)
        if keys:
            await self._release(keys, lease)

    async def cancel(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Make sure `lease` holds none of the slots of `held`, now or later (see `RateLimiter.cancel`).
        Raises BackendError when Redis cannot be asked."""
        await leases.acancel(self.client, self.prefix, held, lease)

    async def renew(self, held: Sequence[tuple[str, Policy]], lease: str, lease_ms: int | None = None) -> int:
        """Make the live slots of `held` under `lease` end `lease_ms` from now, or a full period from now
        (see `RateLimiter.renew`); how many were live. Raises BackendError when Redis cannot be asked."""
        return await leases.arenew(self.client, self.prefix, held, lease, lease_ms)

    async def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies (one call of the decision script: the
        identity's other policies, which share its key, keep theirs)."""
        await self._run(engine.reset_steps(self.prefix, identity, policies))

    def keys(self, identity: str, policies: Sequence[Policy]) -> list[str]:
        """The Redis keys that hold the state of `identity` under these policies."""
        return state_keys(self.prefix, identity, policies)

    async def aclose(self) -> None:
        """Close the limiter's own idle connections (the client, and its pool, stay open). A decision in
        flight puts its connection back when it ends; the limiter stays usable and reconnects as needed."""
        idle = self._idle
        while idle:
            await idle.pop().disconnect()

    # -- the I/O of the steps (see ratelimit_app.core.engine) --------------------------------------------
    async def _run(self, steps: Steps[T]) -> T:
        """Carry out the steps of one operation; what they return."""
        reply: Any = None
        try:
            while True:
                call = steps.send(reply)
                if call is LOAD_SCRIPT:
                    await self._load_script()
                    reply = None
                else:
                    reply = await self._send(call)
        except StopIteration as done:
            return cast(T, done.value)

    async def _load_script(self) -> None:
        try:
            await self.client.script_load(decide_source())
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.load_failed(exc) from exc

    async def _send_cluster(self, call: PreparedCall) -> Any:
        """To the node that owns the call's slot, through the cluster client: naming the node turns
        off the client's retries (a MOVED or ASK redirection, which means nothing ran, is still followed)."""
        client = cast(AsyncRedisCluster, self.client)
        try:
            await client.initialize()  # learns the slots on first use, and again after a failure
            node = client.get_node_from_key(call.keys[0])
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.unreachable(exc) from exc
        try:
            return await client.execute_command(*call.command(), target_nodes=node,
                                                **BINARY_REPLY)
        except NoScriptError:
            return NOSCRIPT
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.failed(exc, sent=True) from exc

    async def _send_pooled(self, call: PreparedCall) -> Any:
        """The reference path: a connection of the client's pool, redis-py's own command packing."""
        pool = cast(redis.asyncio.Redis, self.client).connection_pool
        try:
            connection = await acheckout(pool)
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.unreachable(exc) from exc
        try:
            return await self._write_and_read(connection, call, packed=False)
        finally:
            # a cancelled write or read has already closed the connection (redis-py does on any
            # BaseException), so what goes back to the pool is clean or closed
            await pool.release(connection)

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
                if connection.is_connected and await aclosed_or_dirty(connection):
                    await connection.disconnect()
                if not connection.is_connected:
                    await connection.connect()
            except REDIS_CLIENT_ERRORS as exc:
                await connection.disconnect()
                raise engine.unreachable(exc) from exc
            except BaseException:  # cancelled while connecting: never reuse a half-made connection
                await connection.disconnect(nowait=True)
                raise
            return await self._write_and_read(connection, call, read_timeout=reply_wait(self._read_timeout))
        finally:
            idle.append(connection)
            if slots is not None:
                slots.release()

    async def _write_and_read(self, connection: Any, call: PreparedCall, packed: bool = True,
                              read_timeout: float | None = None) -> Any:
        """Write the call once on `connection` and read its reply (waiting at most `read_timeout`
        seconds when given, else the connection's own socket timeout); a connection whose state is
        unknown after a failure is closed (made again on next use)."""
        sent = False
        try:
            if packed:
                await connection.send_packed_command(call.packed, False)
            else:
                await connection.send_command(*call.command())
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
                await connection.disconnect()
            raise engine.failed(exc, sent) from exc

    async def _release_cluster(self, keys: list[str], lease: str) -> None:
        """One ZREM per slot: the identities may live on different nodes."""
        try:
            for key in keys:
                await self.client.zrem(key, lease)
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.release_failed(lease, exc) from exc

    async def _release_pooled(self, keys: list[str], lease: str) -> None:
        """The ZREMs, in one non-transactional pipeline on a connection of the client's pool."""
        try:
            async with cast(redis.asyncio.Redis, self.client).pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.zrem(key, lease)
                await pipe.execute()
        except REDIS_CLIENT_ERRORS as exc:
            raise engine.release_failed(lease, exc) from exc
