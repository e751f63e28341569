"""The limiters under test: ours, the one-EVALSHA baselines and the peers (their adapters here), each a
`Variant` of the benchmark's table.

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
from typing import Any, cast

from bench.limiters import (
    Baseline,
    ByHits,
    Context,
    Limiter,
    Rate,
    RawBaseline,
    bound,
    ours_single,
    service_tier,
    tier,
)


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



# -- DRF --------------------------------------------------------------------------------------------
class DrfThrottle(ByHits):
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


# -- django-ratelimit -------------------------------------------------------------------------------
def _request_ident(group: str, request: Any) -> str:
    return str(request.ident)


class DjangoRatelimit(ByHits):
    """django-ratelimit's `is_ratelimited(..., increment=True)` on the default (django-redis) cache."""

    def __init__(self, rate: Rate, ctx: Context) -> None:
        from django_ratelimit.core import is_ratelimited

        self.is_ratelimited = is_ratelimited
        self.rate = str(rate)
        self.capacity = rate.limit

    def hit(self, identity: str) -> bool:
        return not self.is_ratelimited(SimpleNamespace(ident=identity), group="bench", key=_request_ident,
                                       rate=self.rate, increment=True)


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


class SmartWindow(ByHits):
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





VARIANTS: tuple[Variant, ...] = (
    Variant("baseline", "redis-py", "baseline: bare EVALSHA of INCR (client.evalsha)", "INCR script", 1, False,
            "redis", "baseline", bound(Baseline), fill_by_hits=True),
    Variant("baseline.raw", "redis-py", "baseline: bare EVALSHA, raw pooled connection", "INCR script", 1, False,
            "redis", "baseline", bound(RawBaseline), fill_by_hits=True),
    Variant("ours.tier", "ratelimit_app", "ours: free tier (3 policies)", "token_bucket+sliding_window+fixed_window",
            3, True, "ratelimit_app", "ours", tier, state_per_unit=True),
    Variant("ours.service.tier", "ratelimit_app", "ours: free tier via service.get_limiter()",
            "token_bucket+sliding_window+fixed_window", 3, True, "ratelimit_app", "ours", service_tier,
            state_per_unit=True,
            note="the service adds the fail modes and the local deny cache"),
    *(Variant(f"ours.{alg}", "ratelimit_app", f"ours: {alg}", alg, 1, alg != "sliding_window_counter",
              "ratelimit_app", "ours", ours_single(alg), state_per_unit=alg == "sliding_window")
      for alg in ("fixed_window", "sliding_window", "sliding_window_counter", "token_bucket", "gcra")),
    Variant("drf", "djangorestframework", "DRF SimpleRateThrottle (django-redis)", "sliding log (pickled list)",
            1, False, "rest_framework", "peer", bound(DrfThrottle), fill_by_hits=True, state_per_unit=True,
            note="GET then SET of a pickled list of timestamps: not atomic"),
    Variant("django-ratelimit", "django-ratelimit", "django-ratelimit (django-redis)", "fixed_window", 1, True,
            "django_ratelimit", "peer", bound(DjangoRatelimit), fill_by_hits=True),
    Variant("limits.fixed", "limits", "limits: fixed window", "fixed_window", 1, True, "limits", "peer",
            bound(Limits, "FixedWindowRateLimiter")),
    Variant("limits.moving", "limits", "limits: moving window", "sliding_window (log)", 1, True, "limits", "peer",
            bound(Limits, "MovingWindowRateLimiter"), state_per_unit=True),
    Variant("limits.sliding_counter", "limits", "limits: sliding window counter", "sliding_window_counter", 1,
            False, "limits", "peer", bound(Limits, "SlidingWindowCounterRateLimiter")),
    *(Variant(f"smart.{alg}", "django-smart-ratelimit", f"django-smart-ratelimit: {alg}", alg, 1, True,
              "django_smart_ratelimit", "peer",
              bound(SmartBucket if alg.endswith("bucket") else SmartWindow, alg), fill_by_hits=alg.endswith("window"),
              state_per_unit=alg == "sliding_window")
      for alg in ("sliding_window", "fixed_window", "token_bucket", "leaky_bucket")),
    *(Variant(f"pyrate.{alg}", "pyrate-limiter", f"pyrate-limiter: {alg}", alg, 1, True, "pyrate_limiter",
              "peer", bound(Pyrate, alg), state_per_unit=alg in ("sliding_window_log", "fixed_window"))
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
