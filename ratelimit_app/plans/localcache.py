"""The in-process layer of the lookups (ratelimit_app.plans.lookups): a bounded map whose entries expire,
and `MISS`, what it answers for "not cached"."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import Any


class _Miss:
    """The "not cached" marker (distinct from a cached None, which means "does not exist")."""

    def __repr__(self) -> str:
        return "MISS"


MISS: Any = _Miss()


class LocalCache:
    """A bounded in-process map whose entries expire `ttl` seconds after they were set.

    Reads take no lock (a dict lookup is atomic in CPython); writes do. When full, the oldest entry is
    dropped; hot entries are re-inserted at every expiry, so they stay. `generation` changes at every
    `clear()`: a value loaded before a clear is not stored after it (see `set`).
    """

    def __init__(self, maxsize: int, ttl: float) -> None:
        self.maxsize = maxsize
        self.ttl = ttl
        self.generation = 0
        self._data: dict[Hashable, tuple[Any, float]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The cached value, or MISS when absent or expired."""
        entry = self._data.get(key)
        if entry is None or entry[1] <= time.monotonic():
            return MISS
        return entry[0]

    def set(self, key: Hashable, value: Any, generation: int | None = None) -> None:
        """Cache `value` for `ttl` seconds, evicting the oldest entries beyond `maxsize`. `generation` is
        `self.generation` read before `value` was loaded: if the cache was cleared since, nothing is
        stored (the value may predate the edit that cleared it)."""
        expires = time.monotonic() + self.ttl
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            self._data.pop(key, None)
            self._data[key] = (value, expires)
            while len(self._data) > self.maxsize:
                del self._data[next(iter(self._data))]

    def discard(self, key: Hashable) -> None:
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.generation += 1

    def __len__(self) -> int:
        return len(self._data)
