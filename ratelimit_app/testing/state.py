"""`IsolatedRateLimit`: limiter state of a test's own (a random key prefix and a movable clock laid over
RATELIMIT, deleted afterwards), what the `ratelimit` fixture and RateLimitTestMixin give each test."""

from __future__ import annotations

import uuid
import warnings
from types import TracebackType
from typing import Any

from ..conf import settings as conf
from ..conf.settings import ratelimit_settings
from ..core.exceptions import REDIS_CLIENT_ERRORS
from ..observability import recorder
from ..service import clock, memory
from ..service.connection import get_redis
from ..service.limiter import get_limiter

#: Keys deleted per DEL when a test's keys are removed.
_DELETE_BATCH = 500


class IsolatedRateLimit:
    """The limiter as one test sees it, under the test's own key `prefix`, from `start()` to `stop()` (or
    `with IsolatedRateLimit() as ...:`)."""

    def __init__(self) -> None:
        self.prefix = f"rltest-{uuid.uuid4().hex[:16]}"
        self._previous: dict[str, Any] | None = None
        self._overlay: dict[str, Any] = {}

    # -- the test's own state ----------------------------------------------------------------------
    def start(self) -> IsolatedRateLimit:
        """Lay the test's key prefix and clock permission over the settings (returns self)."""
        if self._previous is not None:
            raise RuntimeError("this IsolatedRateLimit is already started")
        self._overlay = {"KEY_PREFIX": self.prefix, "CLOCK_SHIFT": True}
        self._previous = conf.set_overlay(self._overlay)
        clock.reset()
        return self

    def stop(self) -> None:
        """Delete the test's state, put the clock back and restore the settings as they were."""
        if self._previous is None:
            return
        try:
            self._forget_state(drop=True)
        finally:
            clock.reset()
            conf.set_overlay(self._previous)
            self._previous = None

    def __enter__(self) -> IsolatedRateLimit:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    # -- what a test does with it ------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Move the limiter's clock `seconds` forward (>= 0) for the rest of this test: windows pass,
        buckets refill, leases run out and calendar months end without waiting (a shift of Redis TIME
        passed with each decision; in the memory backend likewise)."""
        self._require_started()
        clock.advance(seconds)

    @property
    def offset(self) -> float:
        """Seconds the clock has been moved in this test."""
        return clock.offset_ms() / 1000

    def reset(self) -> None:
        """Forget every counter, slot and cached denial of this test (the clock stays where it is)."""
        self._require_started()
        self._forget_state(drop=False)

    def disable(self) -> None:
        """Turn off every limit of ours for the rest of the test, or until `enable()`: the middleware, DRF
        throttles, decorators, concurrency limits and load shedding let every request through and
        nothing is sent to Redis (RATELIMIT['ENABLED'] = False)."""
        self._lay({"ENABLED": False})

    def enable(self) -> None:
        """Undo `disable()`: the limits apply again as the settings say (counters kept)."""
        self._lay({"ENABLED": None})

    # -- internals ---------------------------------------------------------------------------------
    def _require_started(self) -> None:
        if self._previous is None:
            raise RuntimeError("start the IsolatedRateLimit first (the `ratelimit` fixture does)")

    def _lay(self, values: dict[str, Any]) -> None:
        self._require_started()
        overlay = {**self._overlay, **values}
        self._overlay = {name: value for name, value in overlay.items() if value is not None}
        conf.set_overlay(self._overlay)

    def _forget_state(self, *, drop: bool) -> None:
        """Every counter of the test: in Redis (or the memory backend: its store emptied, or dropped when
        `drop`), in this process' deny cache and local fallback, and the metrics counted under its prefix."""
        service = get_limiter()
        service.guard.deny_cache.clear()
        service.guard.fallback.clear()
        if ratelimit_settings.BACKEND == "memory":
            if drop:
                memory.forget(self.prefix)
            else:
                memory.memory_limiter(self.prefix).clear()
            return
        recorder.flush()  # counts recorded under the prefix go to Redis now, to be deleted with the rest
        try:
            _delete_prefix(get_redis(), self.prefix)
        except REDIS_CLIENT_ERRORS as exc:
            warnings.warn(f"ratelimit_app.testing: could not delete the keys under {self.prefix!r} ({exc}); "
                          "they expire with their TTL", RuntimeWarning, stacklevel=3)
        _delete_shared_lookups(self.prefix)


def _delete_prefix(client: Any, prefix: str) -> None:
    """Delete every Redis key under `prefix` (a SCAN; on Redis Cluster, of every master)."""
    batch: list[Any] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= _DELETE_BATCH:
            client.delete(*batch)
            batch = []
    if batch:
        client.delete(*batch)


def _delete_shared_lookups(prefix: str) -> None:
    """The lookups this test shared through the Django cache (RATELIMIT['CACHE_ALIAS']) live under its
    prefix: deleted when the cache can delete by pattern (django-redis); any other cache keeps them
    until they expire, unreachable to other tests, which look under prefixes of their own."""
    from django.core.cache import caches

    try:
        cache = caches[ratelimit_settings.CACHE_ALIAS]
    except Exception:
        return
    delete_pattern = getattr(cache, "delete_pattern", None)
    if callable(delete_pattern):
        try:
            delete_pattern(f"{prefix}:*")
        except Exception as exc:
            warnings.warn(f"ratelimit_app.testing: could not delete the cached lookups under {prefix!r} ({exc})",
                          RuntimeWarning, stacklevel=4)
