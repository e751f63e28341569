"""The asyncio transport of the engine: `AsyncRateLimiter` carries out the steps of ratelimit_app.engine.

Everything but the I/O is shared with the sync `RateLimiter`: the call (`prepare_call`), the exchange
(`decide`: NOSCRIPT recovery, the never-resend rule, one call per slot on a cluster) and the reply
(`parse_reply`). So the two return the same `Decision` for the same state, and fail the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union, cast

import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError

from .decision import Decision
from .engine import NOSCRIPT, Check, PreparedCall, Steps, check_prefix, decide, reset_keys
from .exceptions import BackendError
from .policies import Policy
from .scripts import decide_sha, decide_source

AsyncRedisClient = Union[redis.asyncio.Redis, AsyncRedisCluster]  # noqa: UP007 (a runtime alias)
# What a client raises when Redis cannot answer; RedisClusterException ("no node reachable") is not a
# RedisError.
_REDIS_FAILURES = (RedisError, RedisClusterException, OSError)


class AsyncRateLimiter:
    """Decides requests against policies, like `RateLimiter`, from asyncio code.

    `client` is a `redis.asyncio.Redis` or a `redis.asyncio.cluster.RedisCluster`, used from the event
    loop it belongs to. Each call makes one round trip (EVALSHA of the decision script, plus a SCRIPT
    LOAD when Redis has lost the script). Redis failures raise `BackendError`; a call whose reply is
    lost after it was sent is never resent, because Redis may already have charged it: the client's
    own retries are bypassed (the EVALSHA is written on one connection of the client's pool, or sent
    to one named cluster node, exactly once). A call cancelled while it waits for Redis (a timeout
    around it) closes the connection it used, so no later call reads its reply.
    """

    def __init__(self, client: AsyncRedisClient, prefix: str = "rl") -> None:
        if not isinstance(client, (redis.asyncio.Redis, AsyncRedisCluster)):
            raise TypeError(
                "client: expected a redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster, "
                f"got {type(client).__name__}"
            )
        self.client = client
        self.prefix = check_prefix(prefix)
        self._cluster = isinstance(client, AsyncRedisCluster)
        self._send = self._send_cluster if self._cluster else self._send_pooled

    async def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Charge `cost` to every policy if all of them allow it; charge nothing otherwise."""
        return (await self._run(decide(self.prefix, ((identity, policies),), cost, charge=True,
                                       one_slot_per_call=False)))[0]

    async def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Report what `hit` would decide for `cost`, with remaining counted now; charges nothing."""
        return (await self._run(decide(self.prefix, ((identity, policies),), cost, charge=False,
                                       one_slot_per_call=False)))[0]

    async def hit_many(self, checks: Sequence[Check], cost: int = 1) -> list[Decision]:
        """Decide several identities together; all-or-nothing on a single Redis, one after another on
        Redis Cluster (see `RateLimiter.hit_many`)."""
        return await self._run(decide(self.prefix, checks, cost, charge=True, one_slot_per_call=self._cluster))

    async def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies."""
        keys = reset_keys(self.prefix, identity, policies)
        if keys:
            try:
                await self.client.delete(*keys)
            except _REDIS_FAILURES as exc:
                raise BackendError(f"could not reset {identity!r:.80}: {exc}", maybe_applied=True) from exc

    def keys(self, identity: str, policies: Sequence[Policy]) -> list[str]:
        """The Redis keys that hold the state of `identity` under these policies."""
        return reset_keys(self.prefix, identity, policies)

    async def _run(self, steps: Steps) -> list[Decision]:
        """Carry out the steps of one decision (see ratelimit_app.engine)."""
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
            return cast("list[Decision]", done.value)

    async def _load_script(self) -> None:
        try:
            await self.client.script_load(decide_source())
        except _REDIS_FAILURES as exc:
            raise BackendError(f"could not load the decision script: {exc}", maybe_applied=False) from exc

    async def _send_pooled(self, call: PreparedCall) -> Any:
        """The packed command on a connection of the client's pool."""
        pool = cast(redis.asyncio.Redis, self.client).connection_pool
        try:
            connection = await pool.get_connection()
        except _REDIS_FAILURES as exc:
            raise BackendError(f"Redis unreachable: {exc}", maybe_applied=False) from exc
        sent = False
        try:
            await connection.send_packed_command(call.packed, False)
            sent = True
            return await connection.read_response()
        except NoScriptError:
            return NOSCRIPT
        except _REDIS_FAILURES as exc:
            if not isinstance(exc, ResponseError):
                await connection.disconnect()  # the connection's state is unknown: never reuse it
            raise BackendError(f"Redis failed: {exc}", maybe_applied=sent) from exc
        finally:
            # a cancelled write or read has already closed the connection (redis-py does on any
            # BaseException), so what goes back to the pool is clean or closed
            await pool.release(connection)

    async def _send_cluster(self, call: PreparedCall) -> Any:
        """To the node that owns the call's slot: naming the node turns off the cluster client's
        retries (a MOVED or ASK redirection, which means nothing ran, is still followed)."""
        client = cast(AsyncRedisCluster, self.client)
        keys = call.keys
        try:
            await client.initialize()  # learns the slots on first use, and again after a failure
            node = client.get_node_from_key(keys[0])
        except _REDIS_FAILURES as exc:
            raise BackendError(f"Redis Cluster failed: {exc}", maybe_applied=False) from exc
        try:
            return await client.execute_command("EVALSHA", decide_sha(), call.plan.key_count, *keys,
                                                *call.plan.args, target_nodes=node)
        except NoScriptError:
            return NOSCRIPT
        except _REDIS_FAILURES as exc:
            raise BackendError(f"Redis Cluster failed: {exc}", maybe_applied=True) from exc
