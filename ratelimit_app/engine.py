"""The rate limiter engine: one atomic Redis round trip decides a request against many policies."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Union, cast

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .decision import Decision, PolicyResult
from .policies import Policy
from .scripts import decide_sha, decide_source

RedisClient = Union["redis.Redis", RedisCluster]

_PREFIX = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@lru_cache(maxsize=1024)
def _compile(policies: tuple[Policy, ...]) -> tuple[tuple[str, ...], tuple[int | str, ...]]:
    """Key suffixes and script arguments for a policy set; computed once per distinct set."""
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
        raise ValueError(f"identity: expected a non-empty string, got {identity!r}")
    return hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def _seconds(ms: int) -> float:
    return ms / 1000.0


class RateLimiter:
    """Decides requests against policies using Redis as the one shared state.

    `client` is a `redis.Redis` or a `redis.cluster.RedisCluster`. Each call makes one round trip
    (EVALSHA of the decision script, plus a SCRIPT LOAD when Redis has lost the script). A call
    whose reply is lost after it was sent raises the Redis error; it is never resent, because Redis
    may already have charged it.
    """

    def __init__(self, client: RedisClient, prefix: str = "rl") -> None:
        if not isinstance(prefix, str) or not _PREFIX.match(prefix):
            raise ValueError(f"prefix: {prefix!r} must be 1-64 characters of letters, digits, '_.:-'")
        self.client = client
        self.prefix = prefix
        self._cluster = isinstance(client, RedisCluster)
        self._sha = decide_sha()

    # -- public API -------------------------------------------------------------------------
    def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Charge `cost` to every policy if all of them allow it; charge nothing otherwise."""
        return self._decide([(identity, policies)], cost, charge=True)[0]

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Report what `hit` would decide for `cost`, with remaining counted now; charges nothing."""
        return self._decide([(identity, policies)], cost, charge=False)[0]

    def hit_many(self, checks: Sequence[tuple[str, Sequence[Policy]]], cost: int = 1) -> list[Decision]:
        """Decide several identities together (for example a client IP and its API key).

        On a single Redis this is one round trip and all-or-nothing across every identity. On Redis
        Cluster the identities live on different slots, so they are decided one after another and
        the first denial stops the rest (identities already charged stay charged).
        """
        return self._decide(checks, cost, charge=True)

    def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies."""
        keys = self.keys(identity, policies)
        if keys:
            self.client.delete(*keys)

    def keys(self, identity: str, policies: Sequence[Policy]) -> list[str]:
        """The Redis keys that hold the state of `identity` under these policies."""
        suffixes, _ = _compile(tuple(policies))
        base = f"{self.prefix}:{{{identity_digest(identity)}}}:"
        return [base + suffix for suffix in suffixes]

    # -- internals --------------------------------------------------------------------------
    def _decide(self, checks: Sequence[tuple[str, Sequence[Policy]]], cost: int, *, charge: bool) -> list[Decision]:
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
            raise ValueError(f"cost: {cost!r} must be an integer >= 1")
        compiled = [(identity, tuple(policies)) for identity, policies in checks]
        if self._cluster and len(compiled) > 1:
            decisions: list[Decision] = []
            for item in compiled:
                decision = self._decide_group([item], cost, charge)[0]
                decisions.append(decision)
                if not decision.allowed:
                    break
            return decisions
        return self._decide_group(compiled, cost, charge)

    def _decide_group(self, checks: list[tuple[str, tuple[Policy, ...]]], cost: int, charge: bool) -> list[Decision]:
        keys: list[str] = []
        args: list[int | str] = [cost, 1 if charge else 0, 0]
        for identity, policies in checks:
            suffixes, policy_args = _compile(policies)
            base = f"{self.prefix}:{{{identity_digest(identity)}}}:"
            keys += [base + suffix for suffix in suffixes]
            args += policy_args
        if not keys:
            return [Decision.from_results(()) for _ in checks]
        args[2] = len(keys)
        reply = self._evalsha(keys, args)
        decisions = []
        offset = 1
        for _, policies in checks:
            results = []
            for policy in policies:
                allowed, remaining, reset_ms, retry_ms = reply[offset:offset + 4]
                offset += 4
                if allowed:
                    retry_after = None
                elif retry_ms < 0:
                    retry_after = math.inf
                else:
                    retry_after = _seconds(retry_ms)
                results.append(PolicyResult(policy.name, bool(allowed), policy.capacity, max(int(remaining), 0),
                                            _seconds(reset_ms), retry_after))
            decisions.append(Decision.from_results(tuple(results)))
        if not reply[0]:
            # all-or-nothing: an identity whose own policies allowed was still not charged
            decisions = [d if not d.allowed else _uncharged(d) for d in decisions]
        return decisions

    def _evalsha(self, keys: list[str], args: list[int | str]) -> list[int]:
        try:
            return self._send("EVALSHA", self._sha, len(keys), *keys, *args)
        except NoScriptError:
            # Redis lost its script cache (restart, failover, SCRIPT FLUSH); NOSCRIPT means nothing ran,
            # so loading the script and sending once more cannot charge twice.
            self.client.script_load(decide_source())
            return self._send("EVALSHA", self._sha, len(keys), *keys, *args)

    def _send(self, *command: Any) -> Any:
        if self._cluster:
            return self.client.execute_command(*command)
        # Standalone: talk to a pooled connection directly, so a client configured with retries can
        # never resend an EVALSHA whose reply was lost (Redis may already have charged it).
        pool = cast(redis.Redis, self.client).connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command(*command)
            return conn.read_response()
        except (RedisConnectionError, RedisTimeoutError, OSError):
            conn.disconnect()
            raise
        finally:
            pool.release(conn)


def _uncharged(decision: Decision) -> Decision:
    """A decision for an identity that was not charged because another identity in the call denied."""
    return Decision(False, decision.limit, decision.remaining, decision.reset_after,
                    decision.retry_after, decision.policy, decision.results, decision.degraded)
