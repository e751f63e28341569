"""The rate limiter engine: one atomic Redis round trip decides a request against many policies.

The work is split so that an asyncio client can reuse everything but the I/O: `prepare_call` builds
keys and arguments, `parse_reply` turns the script's reply into decisions, and `RateLimiter` only
sends the prepared call (EVALSHA, with NOSCRIPT recovery) over a synchronous client.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Union, cast

import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from .decision import Decision, PolicyResult
from .exceptions import BackendError
from .policies import Policy
from .scripts import decide_sha, decide_source

RedisClient = Union[redis.Redis, RedisCluster]  # noqa: UP007 (a runtime alias, kept readable)
Check = tuple[str, Sequence[Policy]]

_PREFIX = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
# What a client raises when Redis cannot answer; RedisClusterException ("no node reachable") is not a
# RedisError.
_REDIS_FAILURES = (RedisError, RedisClusterException, OSError)


@lru_cache(maxsize=1024)
def _compile(policies: tuple[Policy, ...]) -> tuple[tuple[str, ...], tuple[int | str, ...]]:
    """Key suffixes and script arguments for a policy set; computed once per distinct set."""
    for policy in policies:
        if not isinstance(policy, Policy):
            raise TypeError(f"policies: expected Policy objects, got {type(policy).__name__}")
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(f"policies: names must be unique within one decision, got {names}")
    suffixes = tuple(f"{p.name}:{p.algorithm}" for p in policies)
    args: list[int | str] = []
    for p in policies:
        args += [p.algorithm, p.limit, p.period_ms, p.capacity]
    return suffixes, tuple(args)


def identity_digest(identity: str) -> str:
    """A fixed-length, hash-tag-safe digest of an identity: users never choose Redis key names."""
    if not isinstance(identity, str) or not identity:
        raise ValueError(f"identity: expected a non-empty string, got {identity!r:.80}")
    return hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def key_base(prefix: str, identity: str) -> str:
    """The start of every key of `identity`: "<prefix>:{<digest>}:" (the braces are the hash tag)."""
    return f"{prefix}:{{{identity_digest(identity)}}}:"


@dataclass(frozen=True)
class PreparedCall:
    """One invocation of the decision script: its KEYS, its ARGV and the checks they encode."""

    keys: list[str]
    args: list[int | str]
    checks: list[tuple[str, tuple[Policy, ...]]]


def prepare_call(prefix: str, checks: Sequence[Check], cost: int, *, charge: bool) -> PreparedCall:
    """Build the KEYS and ARGV of decide.lua for these checks (see its header for the layout)."""
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
        raise ValueError(f"cost: {cost!r} must be an integer >= 1")
    normalized = [(identity, tuple(policies)) for identity, policies in checks]
    keys: list[str] = []
    args: list[int | str] = [cost, 1 if charge else 0, 0]
    for identity, policies in normalized:
        suffixes, policy_args = _compile(policies)
        base = key_base(prefix, identity)
        keys += [base + suffix for suffix in suffixes]
        args += policy_args
    args[2] = len(keys)
    return PreparedCall(keys, args, normalized)


def parse_reply(call: PreparedCall, reply: Any) -> list[Decision]:
    """Turn the script's reply into one Decision per check; a malformed reply raises BackendError."""
    expected = 1 + 4 * len(call.keys)
    if not isinstance(reply, list) or len(reply) != expected or not all(isinstance(v, int) for v in reply):
        raise BackendError(f"unexpected reply from the decision script: {reply!r:.200}", maybe_applied=True)
    decisions = []
    offset = 1
    all_allowed = bool(reply[0])
    for _, policies in call.checks:
        results = []
        for policy in policies:
            allowed, remaining, reset_ms, retry_ms = reply[offset:offset + 4]
            offset += 4
            if allowed:
                retry_after = None
            elif retry_ms < 0:
                retry_after = math.inf
            else:
                retry_after = retry_ms / 1000.0
            results.append(PolicyResult(policy.name, allowed == 1, policy.capacity,
                                        remaining if remaining > 0 else 0, reset_ms / 1000.0, retry_after))
        decision = Decision.from_results(tuple(results))
        if decision.allowed and not all_allowed:
            # all-or-nothing: this identity's own policies allowed, but another identity in the same
            # call denied, so nothing was charged and the request is refused
            decision = decision.refused()
        decisions.append(decision)
    return decisions


class RateLimiter:
    """Decides requests against policies using Redis as the one shared state.

    `client` is a `redis.Redis` or a `redis.cluster.RedisCluster`. Each call makes one round trip
    (EVALSHA of the decision script, plus a SCRIPT LOAD when Redis has lost the script). Redis
    failures raise `BackendError`; a call whose reply is lost after it was sent is never resent,
    because Redis may already have charged it.
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
        self._sha = decide_sha()

    def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Charge `cost` to every policy if all of them allow it; charge nothing otherwise."""
        return self._run(prepare_call(self.prefix, [(identity, policies)], cost, charge=True))[0]

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Report what `hit` would decide for `cost`, with remaining counted now; charges nothing."""
        return self._run(prepare_call(self.prefix, [(identity, policies)], cost, charge=False))[0]

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
                decision = self._run(prepare_call(self.prefix, [check], cost, charge=True))[0]
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
        suffixes, _ = _compile(tuple(policies))
        base = key_base(self.prefix, identity)
        return [base + suffix for suffix in suffixes]

    def _run(self, call: PreparedCall) -> list[Decision]:
        if not call.keys:
            return [Decision.from_results(()) for _ in call.checks]
        command = ("EVALSHA", self._sha, len(call.keys), *call.keys, *call.args)
        try:
            reply = self._send(command)
        except NoScriptError:
            # Redis lost its script cache (restart, failover, SCRIPT FLUSH). NOSCRIPT means nothing ran,
            # so loading the script and sending once more cannot charge twice.
            try:
                self.client.script_load(decide_source())
            except _REDIS_FAILURES as exc:
                raise BackendError(f"could not load the decision script: {exc}", maybe_applied=False) from exc
            reply = self._send(command)
        return parse_reply(call, reply)

    def _send(self, command: tuple[Any, ...]) -> Any:
        if self._cluster:
            try:
                return self.client.execute_command(*command)
            except NoScriptError:
                raise
            except _REDIS_FAILURES as exc:
                raise BackendError(f"Redis Cluster failed: {exc}", maybe_applied=True) from exc
        # Standalone: talk to a pooled connection directly, so a client configured with retries can
        # never resend an EVALSHA whose reply was lost (Redis may already have charged it).
        pool = cast(redis.Redis, self.client).connection_pool
        sent = False
        try:
            conn = pool.get_connection()
        except (RedisError, OSError) as exc:
            raise BackendError(f"Redis unreachable: {exc}", maybe_applied=False) from exc
        try:
            conn.send_command(*command)
            sent = True
            return conn.read_response()
        except NoScriptError:
            raise
        except (RedisError, OSError) as exc:
            if not isinstance(exc, redis.ResponseError):
                conn.disconnect()  # the connection's state is unknown: never reuse it
            raise BackendError(f"Redis failed: {exc}", maybe_applied=sent) from exc
        finally:
            pool.release(conn)
