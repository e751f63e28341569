"""The limiters under test behind one small interface (`Limiter`: `hit`, `fill`, `capacity`), and the
ones that are not peers: the one-EVALSHA baselines and ours (the engine, and the service above it).
The peers' adapters and the table of every variant are in bench/peers.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis

#: The trivial script of the baseline: the cost of one Redis round trip from Python.
INCR_SCRIPT = "return redis.call('INCR', KEYS[1])"


@dataclass(frozen=True)
class Rate:
    """`limit` units per `period` seconds (period is 1, 60, 3600 or 86400 so every library can express it)."""

    limit: int
    period: int

    @property
    def unit(self) -> str:
        """The period as the one-letter unit DRF and django-ratelimit parse ("s", "m", "h", "d")."""
        units = {1: "s", 60: "m", 3600: "h", 86400: "d"}
        if self.period not in units:
            raise ValueError(f"period: {self.period} is not one of {sorted(units)} seconds")
        return units[self.period]

    def __str__(self) -> str:
        return f"{self.limit}/{self.unit}"


class Limiter(Protocol):
    """What the measurements need from a limiter under test."""

    #: Most units one identity is admitted before it is denied (the tightest policy's capacity).
    capacity: int

    def hit(self, identity: str) -> bool:
        """Decide one request of `identity`; True when admitted."""

    def fill(self, identity: str) -> None:
        """Charge `identity` up to its limit (used to measure memory per active identity)."""


@dataclass(frozen=True)
class Context:
    """What a worker process hands every builder: the Redis URL and a shared redis-py client."""

    url: str
    client: redis.Redis



class ByHits:
    """A limiter without a cost argument: `fill` hits until the identity is denied."""

    capacity: int

    def hit(self, identity: str) -> bool:
        raise NotImplementedError

    def fill(self, identity: str) -> None:
        for _ in range(self.capacity + 1):
            if not self.hit(identity):
                return


def bound(cls: Callable[..., Limiter], *args: Any) -> Callable[[Rate, Context], Limiter]:
    """A builder of `cls(*args, rate, ctx)`, documented as `cls` (the report quotes builders' docstrings)."""
    def build(rate: Rate, ctx: Context) -> Limiter:
        return cls(*args, rate, ctx)

    build.__doc__ = cls.__doc__
    return build


# -- baseline ---------------------------------------------------------------------------------------
class Baseline(ByHits):
    """One EVALSHA of a trivial INCR script per decision, through `client.evalsha` (redis-py's public call)."""

    def __init__(self, rate: Rate, ctx: Context) -> None:
        self.capacity = rate.limit
        self.client = ctx.client
        self.sha = ctx.client.script_load(INCR_SCRIPT)

    def hit(self, identity: str) -> bool:
        return int(self.client.evalsha(self.sha, 1, "bl:" + identity)) <= self.capacity


class RawBaseline(Baseline):
    """The same EVALSHA sent the way ratelimit_app's engine sends it: `send_command` / `read_response`
    straight on a pooled connection, without redis-py's command wrapper."""

    def hit(self, identity: str) -> bool:
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command("EVALSHA", self.sha, 1, "bl:" + identity)
            reply = conn.read_response()
        finally:
            pool.release(conn)
        return int(reply) <= self.capacity


# -- ours -------------------------------------------------------------------------------------------
def tier_policies(rate: Rate) -> list[Any]:
    """A 3-policy tier shaped like the seeded free tier, scaled by `rate`.

    rate 20/m gives exactly the free tier: token_bucket burst 10 refilling 20/min, sliding_window
    20/min, fixed_window 1000/day. Its tightest capacity is the burst, rate.limit // 2.
    """
    from ratelimit_app import Policy

    return [
        Policy("burst", "token_bucket", limit=rate.limit, period=rate.period, burst=max(1, rate.limit // 2)),
        Policy("minute", "sliding_window", limit=rate.limit, period=rate.period),
        Policy("day", "fixed_window", limit=50 * rate.limit, period=86400),
    ]


class Ours:
    """`RateLimiter.hit(identity, policies)` on the shared client."""

    def __init__(self, policies: list[Any], ctx: Context, prefix: str = "rl") -> None:
        from ratelimit_app import RateLimiter

        self.limiter = RateLimiter(ctx.client, prefix=prefix)
        self.policies = policies
        self.capacity = min(p.capacity for p in policies)

    def hit(self, identity: str) -> bool:
        return self.limiter.hit(identity, self.policies).allowed

    def fill(self, identity: str) -> None:
        self.limiter.hit(identity, self.policies, cost=self.capacity)


class OursService(Ours):
    """`ratelimit_app.service.limiter.get_limiter().hit(...)`: what request handling calls (settings-built client)."""

    def __init__(self, policies: list[Any], ctx: Context) -> None:
        from ratelimit_app.service.limiter import get_limiter

        self.service = get_limiter()
        self.policies = policies
        self.capacity = min(p.capacity for p in policies)

    def hit(self, identity: str) -> bool:
        return self.service.hit(identity, self.policies).allowed

    def fill(self, identity: str) -> None:
        self.service.hit(identity, self.policies, cost=self.capacity)


def ours_single(algorithm: str) -> Callable[[Rate, Context], Limiter]:
    """A builder of `Ours` with one policy of `algorithm` at the rate."""
    def build(rate: Rate, ctx: Context) -> Limiter:
        from ratelimit_app import Policy

        return Ours([Policy("limit", algorithm, limit=rate.limit, period=rate.period)], ctx)

    build.__doc__ = Ours.__doc__
    return build



def tier(rate: Rate, ctx: Context) -> Limiter:
    """`RateLimiter.hit(identity, policies)` with the three policies of the tier, on the shared client."""
    return Ours(tier_policies(rate), ctx)


def service_tier(rate: Rate, ctx: Context) -> Limiter:
    """`ratelimit_app.service.limiter.get_limiter().hit(identity, policies)`: the call request-handling code makes."""
    return OursService(tier_policies(rate), ctx)

