"""ratelimit_app.plans.localcache: entries expire, the map is bounded (the newest kept), and a value
loaded before a clear (an edit announced meanwhile) is not stored after it."""

from __future__ import annotations

from ratelimit_app.plans.localcache import MISS, LocalCache
from tests.support.limits_support import poll


def test_local_cache_entries_expire() -> None:
    cache = LocalCache(maxsize=3, ttl=0.2)
    cache.set("a", 1)
    assert cache.get("a") == 1 and cache.get("b") is MISS
    assert poll(lambda: cache.get("a") is MISS, deadline=2)
    for name in "bcde":
        cache.set(name, name)
    assert len(cache) == 3 and cache.get("b") is MISS and cache.get("e") == "e"


def test_a_value_loaded_before_a_clear_is_not_stored_after_it() -> None:
    cache = LocalCache(maxsize=10, ttl=60)
    generation = cache.generation
    cache.clear()  # an edit was announced while the value was being loaded
    cache.set("key", "old row", generation)
    assert len(cache) == 0
    cache.set("key", "new row", cache.generation)
    assert cache.get("key") == "new row"
