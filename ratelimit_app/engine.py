"""The rate limiter engine: one atomic Redis round trip decides a request against many policies.

The work is split so that an asyncio client can reuse everything but the I/O: `prepare_call` builds
keys and arguments (and the whole EVALSHA command, packed), `parse_reply` turns the script's reply
into decisions, and `RateLimiter` only sends the prepared call (EVALSHA, with NOSCRIPT recovery)
over a synchronous client.

Speed matters here: this runs on every request. The packed command of a policy set is built once and
cached (`_plan`); a call only splices in the identity's digest. On a standalone Redis each thread
keeps its own connection (see `RateLimiter`), so a decision costs one write and one read, with no
pool checkout.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import struct
import threading
import time
from binascii import hexlify
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Union, cast

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError

from .decision import Decision, new_policy_result
from .exceptions import REDIS_CLIENT_ERRORS, BackendError
from .policies import CONCURRENCY, Policy
from .scripts import decide_sha, decide_source

RedisClient = Union[redis.Redis, RedisCluster]  # noqa: UP007 (a runtime alias, kept readable)
Check = tuple[str, Sequence[Policy]]

_PREFIX = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
#: Length of an identity digest in hex characters (blake2b, 12 bytes).
DIGEST_CHARS = 24
#: decide.lua takes every number of a call in one binary argument (see its header): a decimal argument
#: would cost Redis a strtod each, and every argument is parsed and interned as a Lua string.
_CALL_NUMBERS = struct.Struct(">qq")  # cost, charge
_POLICY_NUMBERS = struct.Struct(">qqqq")  # algorithm code, limit, period in ms, capacity
#: The algorithm codes decide.lua dispatches on.
ALGORITHM_CODES = {"token_bucket": 1, "sliding_window": 2, "fixed_window": 3, "gcra": 4, "sliding_window_counter": 5,
                   CONCURRENCY: 6}
#: A lease token (ARGV[2] of decide.lua): the member a request's concurrency slots are held under.
_LEASE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_INTEGERS = {int}
#: A thread's connection unused for longer than this (seconds) is checked for a server-side close
#: (a restart, an idle timeout) before it is used again, as a pool checkout would; one in back-to-back
#: use skips that system call, which costs about as much as the rest of the client's work.
IDLE_CHECK_AFTER = 0.01


def _bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


class _Plan:
    """Everything about a call that depends only on the prefix, the policy sets, the cost and the mode.

    `pieces` is the packed EVALSHA command cut where each key's identity digest goes: the command is
    `pieces[0] + digest(owner 0) + pieces[1] + ... + pieces[-1]`, with `owners[i]` the index of the
    check whose digest fills gap i. Built once per distinct plan (see `_plan`).
    """

    __slots__ = ("args", "key_count", "leases", "named_capacities", "owners", "pieces", "prefix", "suffixes")

    def __init__(self, prefix: str, policy_sets: tuple[tuple[Policy, ...], ...], cost: int, charge: bool) -> None:
        self.prefix = prefix
        suffixes: list[tuple[str, ...]] = []
        numbers = [_CALL_NUMBERS.pack(cost, 1 if charge else 0)]
        for policies in policy_sets:
            for policy in policies:
                if not isinstance(policy, Policy):
                    raise TypeError(f"policies: expected Policy objects, got {type(policy).__name__}")
            names = [p.name for p in policies]
            if len(set(names)) != len(names):
                raise ValueError(f"policies: names must be unique within one decision, got {names}")
            suffixes.append(tuple(f"{p.name}:{p.algorithm}" for p in policies))
            numbers += [_POLICY_NUMBERS.pack(ALGORITHM_CODES[p.algorithm], p.limit, p.period_ms, p.capacity)
                        for p in policies]
        self.suffixes = tuple(suffixes)
        self.named_capacities = tuple(tuple((p.name, p.capacity) for p in policies) for policies in policy_sets)
        self.key_count = sum(len(s) for s in suffixes)
        # concurrency policies charged by this call: the command then ends with the lease token (ARGV[2])
        self.leases = sum(p.algorithm == CONCURRENCY for policies in policy_sets for p in policies) if charge else 0
        args = [b"".join(numbers)]
        self.args = tuple(args)

        head = prefix.encode() + b":{"
        pieces: list[bytes] = []
        owners: list[int] = []
        current = b"*%d\r\n" % (3 + self.key_count + len(args) + (1 if self.leases else 0)) + _bulk(b"EVALSHA") + \
            _bulk(decide_sha().encode()) + _bulk(b"%d" % self.key_count)
        for owner, set_suffixes in enumerate(suffixes):
            for suffix in set_suffixes:
                tail = b"}:" + suffix.encode()
                current += b"$%d\r\n" % (len(head) + DIGEST_CHARS + len(tail)) + head
                pieces.append(current)
                owners.append(owner)
                current = tail + b"\r\n"
        pieces.append(current + b"".join(_bulk(arg) for arg in args))
        self.pieces = tuple(pieces)
        self.owners = tuple(owners)


@lru_cache(maxsize=1024)
def _plan(prefix: str, policy_sets: tuple[tuple[Policy, ...], ...], cost: int, charge: bool) -> _Plan:
    return _Plan(prefix, policy_sets, cost, charge)


def _digest(identity: str) -> bytes:
    if type(identity) is not str or not identity:
        raise ValueError(f"identity: expected a non-empty string, got {identity!r:.80}")
    return hexlify(hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=12).digest())


def identity_digest(identity: str) -> str:
    """A fixed-length, hash-tag-safe digest of an identity: users never choose Redis key names."""
    return _digest(identity).decode()


class PreparedCall:
    """One invocation of the decision script: the packed command, and what `parse_reply` needs.

    `keys` and `args` give the same call as KEYS and ARGV lists, for clients that pack commands
    themselves (Redis Cluster routes by key).
    """

    __slots__ = ("digests", "lease", "packed", "plan")

    def __init__(self, plan: _Plan, digests: list[bytes], packed: bytes, lease: bytes | None = None) -> None:
        self.plan = plan
        self.digests = digests
        self.packed = packed
        self.lease = lease

    @property
    def keys(self) -> list[str]:
        """Each key is "<prefix>:{<digest>}:<policy>:<algorithm>" (the braces are the hash tag)."""
        keys = []
        for digest, suffixes in zip(self.digests, self.plan.suffixes, strict=True):
            base = f"{self.plan.prefix}:{{{digest.decode()}}}:"
            keys += [base + suffix for suffix in suffixes]
        return keys

    @property
    def args(self) -> list[bytes]:
        return [*self.plan.args, self.lease] if self.lease is not None else list(self.plan.args)


def _with_lease(call: PreparedCall, lease: str | None) -> PreparedCall:
    """`call` with the lease token its concurrency policies are charged under (ARGV[2] of decide.lua)."""
    if lease is None:
        raise ValueError("lease: this call takes a concurrency slot; pass lease=<token> (see new_lease_token), "
                         "the name under which the slot is held and released")
    if type(lease) is not str or not _LEASE.match(lease):
        raise ValueError(f"lease: {lease!r:.80} must be 1-64 characters of letters, digits, '_.:-'")
    token = lease.encode()
    call.lease = token
    call.packed += _bulk(token)
    return call


def new_lease_token() -> str:
    """A token no other request holds: 128 random bits (unique across every process and server)."""
    return os.urandom(16).hex()


def prepare_call(prefix: str, checks: Sequence[Check], cost: int, *, charge: bool,
                 lease: str | None = None) -> PreparedCall:
    """Build the EVALSHA of decide.lua for these checks (see its header for KEYS and ARGV). A call that
    charges a concurrency policy needs `lease`, the token its slots are held under (ValueError without)."""
    if type(cost) is not int or cost < 1:
        raise ValueError(f"cost: {cost!r} must be an integer >= 1")
    if len(checks) == 1:  # the usual case, kept short: it runs on every request
        identity, policies = checks[0]
        plan = _plan(prefix, (policies if type(policies) is tuple else tuple(policies),), cost, charge)
        digest = _digest(identity)
        call = PreparedCall(plan, [digest], digest.join(plan.pieces))
        return _with_lease(call, lease) if plan.leases else call
    policy_sets = tuple(policies if type(policies) is tuple else tuple(policies) for _, policies in checks)
    plan = _plan(prefix, policy_sets, cost, charge)
    digests = [_digest(identity) for identity, _ in checks]
    pieces = plan.pieces
    parts = [pieces[0]]
    for gap, owner in enumerate(plan.owners, 1):
        parts.append(digests[owner])
        parts.append(pieces[gap])
    call = PreparedCall(plan, digests, b"".join(parts))
    return _with_lease(call, lease) if plan.leases else call


def parse_reply(call: PreparedCall, reply: Any) -> list[Decision]:
    """Turn the script's reply into one Decision per check; a malformed reply raises BackendError."""
    plan = call.plan
    if type(reply) is not list or len(reply) != 1 + 4 * plan.key_count or set(map(type, reply)) != _INTEGERS:
        raise BackendError(f"unexpected reply from the decision script: {reply!r:.200}", maybe_applied=True)
    values = iter(reply)
    all_allowed = next(values) == 1
    decisions = []
    for policies in plan.named_capacities:
        results = []
        # each policy takes the next four values (allowed, remaining, reset_ms, retry_ms) of one iterator
        quads = zip(policies, values, values, values, values, strict=False)
        for (name, capacity), allowed, remaining, reset_ms, retry_ms in quads:
            if allowed:
                retry_after = None
            elif retry_ms < 0:
                retry_after = math.inf
            else:
                retry_after = retry_ms / 1000
            results.append(new_policy_result(name, allowed == 1, capacity, remaining if remaining > 0 else 0,
                                             reset_ms / 1000, retry_after))
        decision = Decision.from_results(tuple(results))
        if decision.allowed and not all_allowed:
            # all-or-nothing: this identity's own policies allowed, but another identity in the same
            # call denied, so nothing was charged and the request is refused
            decision = decision.refused()
        decisions.append(decision)
    return decisions


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

    def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1, *, lease: str | None = None) -> Decision:
        """Charge `cost` to every policy if all of them allow it; charge nothing otherwise. A concurrency
        policy takes one slot, held under `lease` (required then) until `release` or the lease period."""
        return self._run(prepare_call(self.prefix, ((identity, policies),), cost, charge=True, lease=lease))[0]

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Report what `hit` would decide for `cost`, with remaining counted now; charges nothing."""
        return self._run(prepare_call(self.prefix, ((identity, policies),), cost, charge=False))[0]

    def hit_many(self, checks: Sequence[Check], cost: int = 1, *, lease: str | None = None) -> list[Decision]:
        """Decide several identities together (for example a client IP and its API key).

        On a single Redis this is one round trip and all-or-nothing across every identity. On Redis
        Cluster the identities live on different slots, so they are decided one after another and
        the first denial stops the rest (identities already charged stay charged; the list is then
        shorter than `checks`). `lease` as in `hit`.
        """
        if self._cluster and len(checks) > 1:
            decisions: list[Decision] = []
            for check in checks:
                decision = self._run(prepare_call(self.prefix, (check,), cost, charge=True, lease=lease))[0]
                decisions.append(decision)
                if not decision.allowed:
                    break
            return decisions
        return self._run(prepare_call(self.prefix, checks, cost, charge=True, lease=lease))

    def release(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Give back the concurrency slots held under `lease`: each (identity, concurrency policy) of
        `held`. One round trip on a single Redis (one ZREM per slot, pipelined); a slot already freed
        (its lease ran out) is left alone. Raises BackendError when Redis cannot be asked (the slots
        then free themselves when their lease runs out)."""
        keys = [key for identity, policy in held for key in self.keys(identity, (policy,))]
        if not keys:
            return
        try:
            if self._cluster:
                for key in keys:  # the identities may live on different nodes
                    self.client.zrem(key, lease)
                return
            connection = self._connection()
            if not connection.is_connected:
                connection.connect()
            connection.send_packed_command(connection.pack_commands([("ZREM", key, lease) for key in keys]))
            for _ in keys:
                connection.read_response()
        except (RedisError, OSError) as exc:
            self.close()
            raise BackendError(f"could not release slots of lease {lease!r}: {exc}", maybe_applied=True) from exc

    def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies."""
        keys = self.keys(identity, policies)
        if keys:
            try:
                self.client.delete(*keys)
            except REDIS_CLIENT_ERRORS as exc:
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
            except REDIS_CLIENT_ERRORS as exc:
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
                                                   *call.args)
            except NoScriptError:
                raise
            except REDIS_CLIENT_ERRORS as exc:
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
