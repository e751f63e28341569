"""The limiters under test: ours, the one-EVALSHA baseline and the peers, behind one small interface.

Every variant is built per process by `build(key, rate, ctx)` and answers `hit(identity) -> bool`
(True when admitted) through the library's own public decision call, configured the way its docs
show. `fill(identity)` charges one identity up to its limit (with the library's cost/weight argument
when it has one, else by repeated hits) for the memory measurement. A peer whose package is not
importable is reported as unavailable, never silently dropped.

Peers talk to the benchmark's Redis through the same redis-py client as ours wherever the library
accepts a client or pool (limits, pyrate-limiter); Django-cache-based peers (DRF, django-ratelimit)
use django-redis' pool from CACHES, and django-smart-ratelimit builds its own pool from
RATELIMIT_REDIS. All of them use the hiredis parser when it is installed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol, cast

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


@dataclass(frozen=True)
class Variant:
    """One row of the benchmark: a library, an algorithm and how many policies one decision checks."""

    key: str
    library: str
    label: str
    algorithm: str
    policies: int
    exact: bool
    requires: str  # module that must be importable for this variant to run
    family: str  # "baseline", "ours" or "peer"
    builder: Callable[[Rate, Context], Limiter]
    note: str = ""
    #: fill() can only repeat hits (the library has no cost/weight argument)
    fill_by_hits: bool = False
    #: the state in Redis grows with every admitted unit (a log), so filling costs O(limit) work
    state_per_unit: bool = False


def _fill_by_hits(limiter: Limiter, identity: str) -> None:
    for _ in range(limiter.capacity + 1):
        if not limiter.hit(identity):
            return


# -- baseline ---------------------------------------------------------------------------------------
class Baseline:
    """One EVALSHA of a trivial INCR script per decision, through `client.evalsha` (redis-py's public call)."""

    def __init__(self, rate: Rate, ctx: Context) -> None:
        self.capacity = rate.limit
        self.client = ctx.client
        self.sha = ctx.client.script_load(INCR_SCRIPT)

    def hit(self, identity: str) -> bool:
        return int(self.client.evalsha(self.sha, 1, "bl:" + identity)) <= self.capacity

    def fill(self, identity: str) -> None:
        _fill_by_hits(self, identity)


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


def _ours(algorithm: str) -> Callable[[Rate, Context], Limiter]:
    def build(rate: Rate, ctx: Context) -> Limiter:
        from ratelimit_app import Policy

        return Ours([Policy("limit", algorithm, limit=rate.limit, period=rate.period)], ctx)

    build.__doc__ = Ours.__doc__
    return build


# -- DRF --------------------------------------------------------------------------------------------
class DrfThrottle:
    """DRF `SimpleRateThrottle.allow_request` with the default (django-redis) cache; a new throttle per
    request, as DRF's APIView makes one."""

    def __init__(self, rate: Rate, ctx: Context) -> None:
        from rest_framework.throttling import SimpleRateThrottle

        class BenchThrottle(SimpleRateThrottle):
            scope = "bench"

            def get_cache_key(self, request: Any, view: Any) -> str:
                return self.cache_format % {"scope": self.scope, "ident": request.ident}

        BenchThrottle.rate = str(rate)
        self.throttle_class = BenchThrottle
        self.capacity = rate.limit

    def hit(self, identity: str) -> bool:
        request: Any = SimpleNamespace(ident=identity)  # all get_cache_key reads
        return bool(self.throttle_class().allow_request(request, cast(Any, None)))

    def fill(self, identity: str) -> None:
        _fill_by_hits(self, identity)


# -- django-ratelimit -------------------------------------------------------------------------------
def _request_ident(group: str, request: Any) -> str:
    return str(request.ident)


class DjangoRatelimit:
    """django-ratelimit's `is_ratelimited(..., increment=True)` on the default (django-redis) cache."""

    def __init__(self, rate: Rate, ctx: Context) -> None:
        from django_ratelimit.core import is_ratelimited

        self.is_ratelimited = is_ratelimited
        self.rate = str(rate)
        self.capacity = rate.limit

    def hit(self, identity: str) -> bool:
        return not self.is_ratelimited(SimpleNamespace(ident=identity), group="bench", key=_request_ident,
                                       rate=self.rate, increment=True)

    def fill(self, identity: str) -> None:
        _fill_by_hits(self, identity)


# -- limits -----------------------------------------------------------------------------------------
class Limits:
    """The `limits` library: `strategy.hit(item, identity)` on a RedisStorage sharing our connection pool."""

    def __init__(self, strategy_name: str, rate: Rate, ctx: Context) -> None:
        import limits
        from limits.storage import RedisStorage

        storage = RedisStorage(ctx.url, connection_pool=ctx.client.connection_pool)
        self.strategy = getattr(limits.strategies, strategy_name)(storage)
        self.item = limits.RateLimitItemPerSecond(rate.limit, rate.period)
        self.capacity = rate.limit

    def hit(self, identity: str) -> bool:
        return bool(self.strategy.hit(self.item, identity))

    def fill(self, identity: str) -> None:
        self.strategy.hit(self.item, identity, cost=self.capacity)


def _limits(strategy_name: str) -> Callable[[Rate, Context], Limiter]:
    def build(rate: Rate, ctx: Context) -> Limiter:
        return Limits(strategy_name, rate, ctx)

    build.__doc__ = Limits.__doc__
    return build


# -- django-smart-ratelimit -------------------------------------------------------------------------
_smart_backends: dict[str, Any] = {}


def _smart_backend(algorithm: str) -> Any:
    """One RedisBackend per window algorithm (the backend reads its algorithm from RATELIMIT_ALGORITHM)."""
    if algorithm not in _smart_backends:
        from django_smart_ratelimit.backends.redis_backend import RedisBackend

        backend = RedisBackend()
        backend.algorithm = algorithm
        _smart_backends[algorithm] = backend
    return _smart_backends[algorithm]


class SmartWindow:
    """django-smart-ratelimit's decorator path for window algorithms: `check_rate_limit(ctx, backend)`
    (a Lua increment, then the reset time the decorator puts in its headers)."""

    def __init__(self, algorithm: str, rate: Rate, ctx: Context) -> None:
        from django_smart_ratelimit.context import RateLimitContext
        from django_smart_ratelimit.decorator import check_rate_limit

        self.backend = _smart_backend(algorithm)
        self.check = check_rate_limit
        self.context = RateLimitContext
        self.rate = rate
        self.capacity = rate.limit

    def hit(self, identity: str) -> bool:
        ctx = self.context(request=None, key=identity, limit=self.rate.limit, period=self.rate.period)
        return bool(self.check(ctx, self.backend).allowed)

    def fill(self, identity: str) -> None:
        _fill_by_hits(self, identity)


class SmartBucket:
    """django-smart-ratelimit's bucket algorithms (`TokenBucketAlgorithm` / `LeakyBucketAlgorithm`
    `.is_allowed(backend, key, limit, period)`), as its decorator runs them."""

    def __init__(self, algorithm: str, rate: Rate, ctx: Context) -> None:
        from django_smart_ratelimit.algorithms import LeakyBucketAlgorithm, TokenBucketAlgorithm

        self.backend = _smart_backend("sliding_window")
        self.leaky = algorithm == "leaky_bucket"
        self.algorithm = LeakyBucketAlgorithm(None) if self.leaky else TokenBucketAlgorithm(None)
        self.rate = rate
        self.capacity = rate.limit

    def hit(self, identity: str) -> bool:
        allowed, _ = self.algorithm.is_allowed(self.backend, identity, self.rate.limit, self.rate.period)
        return bool(allowed)

    def fill(self, identity: str) -> None:
        cost = {"request_cost": self.capacity} if self.leaky else {"tokens_requested": self.capacity}
        self.algorithm.is_allowed(self.backend, identity, self.rate.limit, self.rate.period, **cost)


def _smart(algorithm: str) -> Callable[[Rate, Context], Limiter]:
    def build(rate: Rate, ctx: Context) -> Limiter:
        if algorithm in ("token_bucket", "leaky_bucket"):
            return SmartBucket(algorithm, rate, ctx)
        return SmartWindow(algorithm, rate, ctx)

    bucket = algorithm in ("token_bucket", "leaky_bucket")
    build.__doc__ = (SmartBucket if bucket else SmartWindow).__doc__
    return build


# -- pyrate-limiter ---------------------------------------------------------------------------------
class Pyrate:
    """pyrate-limiter: `Limiter.try_acquire(identity, blocking=False)` with one Redis bucket per identity.

    pyrate-limiter routes names to buckets through a BucketFactory; this one makes a bucket per
    identity on first use (RedisBucket for the log algorithms, StateBucket + RedisStateStore for GCRA
    and token bucket) and schedules no leaker thread, so measurements are not disturbed by it.
    """

    def __init__(self, algorithm: str, rate: Rate, ctx: Context) -> None:
        import pyrate_limiter as pl
        from pyrate_limiter.buckets.redis_bucket import LuaScript

        client = ctx.client
        rates = [pl.Rate(rate.limit, rate.period * 1000)]
        if algorithm in ("sliding_window_log", "fixed_window"):
            sha = client.script_load(LuaScript.PUT_ITEM)
            log_algorithm = pl.FixedWindow() if algorithm == "fixed_window" else pl.SlidingWindowLog()

            def make(name: str) -> Any:
                return pl.RedisBucket(rates, client, f"pyrate:{name}", sha, log_algorithm)
        else:
            state_algorithm = pl.GCRA() if algorithm == "gcra" else pl.TokenBucket()

            def make(name: str) -> Any:
                return pl.StateBucket(rates, state_algorithm, pl.RedisStateStore(client, f"pyrate:{name}"))

        buckets: dict[str, Any] = {}

        class PerIdentity(pl.BucketFactory):
            def wrap_item(self, name: str, weight: int = 1) -> Any:
                bucket = buckets.get(name)
                if bucket is None:
                    bucket = buckets[name] = make(name)
                return pl.RateItem(name, bucket.now(), weight=weight)

            def get(self, item: Any) -> Any:
                return buckets[item.name]

        self.limiter = pl.Limiter(PerIdentity())
        self.capacity = rate.limit

    def hit(self, identity: str) -> bool:
        return bool(self.limiter.try_acquire(identity, blocking=False))

    def fill(self, identity: str) -> None:
        self.limiter.try_acquire(identity, weight=self.capacity, blocking=False)


def _pyrate(algorithm: str) -> Callable[[Rate, Context], Limiter]:
    def build(rate: Rate, ctx: Context) -> Limiter:
        return Pyrate(algorithm, rate, ctx)

    build.__doc__ = Pyrate.__doc__
    return build


def _tier(rate: Rate, ctx: Context) -> Limiter:
    """`RateLimiter.hit(identity, policies)` with the three policies of the tier, on the shared client."""
    return Ours(tier_policies(rate), ctx)


def _service_tier(rate: Rate, ctx: Context) -> Limiter:
    """`ratelimit_app.service.limiter.get_limiter().hit(identity, policies)`: the call request-handling code makes."""
    return OursService(tier_policies(rate), ctx)


VARIANTS: tuple[Variant, ...] = (
    Variant("baseline", "redis-py", "baseline: bare EVALSHA of INCR (client.evalsha)", "INCR script", 1, False,
            "redis", "baseline", Baseline, fill_by_hits=True),
    Variant("baseline.raw", "redis-py", "baseline: bare EVALSHA, raw pooled connection", "INCR script", 1, False,
            "redis", "baseline", RawBaseline, fill_by_hits=True),
    Variant("ours.tier", "ratelimit_app", "ours: free tier (3 policies)", "token_bucket+sliding_window+fixed_window",
            3, True, "ratelimit_app", "ours", _tier, state_per_unit=True),
    Variant("ours.service.tier", "ratelimit_app", "ours: free tier via service.get_limiter()",
            "token_bucket+sliding_window+fixed_window", 3, True, "ratelimit_app", "ours", _service_tier,
            state_per_unit=True,
            note="the service adds the fail modes and the local deny cache"),
    *(Variant(f"ours.{alg}", "ratelimit_app", f"ours: {alg}", alg, 1, alg != "sliding_window_counter",
              "ratelimit_app", "ours", _ours(alg), state_per_unit=alg == "sliding_window")
      for alg in ("fixed_window", "sliding_window", "sliding_window_counter", "token_bucket", "gcra")),
    Variant("drf", "djangorestframework", "DRF SimpleRateThrottle (django-redis)", "sliding log (pickled list)",
            1, False, "rest_framework", "peer", DrfThrottle, fill_by_hits=True, state_per_unit=True,
            note="GET then SET of a pickled list of timestamps: not atomic"),
    Variant("django-ratelimit", "django-ratelimit", "django-ratelimit (django-redis)", "fixed_window", 1, True,
            "django_ratelimit", "peer", DjangoRatelimit, fill_by_hits=True),
    Variant("limits.fixed", "limits", "limits: fixed window", "fixed_window", 1, True, "limits", "peer",
            _limits("FixedWindowRateLimiter")),
    Variant("limits.moving", "limits", "limits: moving window", "sliding_window (log)", 1, True, "limits", "peer",
            _limits("MovingWindowRateLimiter"), state_per_unit=True),
    Variant("limits.sliding_counter", "limits", "limits: sliding window counter", "sliding_window_counter", 1,
            False, "limits", "peer", _limits("SlidingWindowCounterRateLimiter")),
    *(Variant(f"smart.{alg}", "django-smart-ratelimit", f"django-smart-ratelimit: {alg}", alg, 1, True,
              "django_smart_ratelimit", "peer", _smart(alg), fill_by_hits=alg.endswith("window"),
              state_per_unit=alg == "sliding_window")
      for alg in ("sliding_window", "fixed_window", "token_bucket", "leaky_bucket")),
    *(Variant(f"pyrate.{alg}", "pyrate-limiter", f"pyrate-limiter: {alg}", alg, 1, True, "pyrate_limiter",
              "peer", _pyrate(alg), state_per_unit=alg in ("sliding_window_log", "fixed_window"))
      for alg in ("sliding_window_log", "fixed_window", "gcra", "token_bucket")),
)

BY_KEY = {variant.key: variant for variant in VARIANTS}


def availability() -> dict[str, str | None]:
    """For each variant, None when it can run here, else why not (the import error)."""
    result: dict[str, str | None] = {}
    for variant in VARIANTS:
        try:
            importlib.import_module(variant.requires)
            result[variant.key] = None
        except ImportError as exc:
            result[variant.key] = f"{variant.requires} is not importable ({exc})"
    return result


def build(key: str, rate: Rate, ctx: Context) -> Limiter:
    """Build the limiter of variant `key` for `rate` (call in the process that will use it)."""
    return BY_KEY[key].builder(rate, ctx)
