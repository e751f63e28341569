"""Cached lookups of tiers, API keys, user tiers and client rules: what request handling reads instead of
the models, through three layers, fastest first: an in-process cache (bounded, expiring after CACHE_TTL,
forgotten on an edit: plans.edits), the Django cache of CACHE_ALIAS when app servers share it (plain rows
under a generation that every save or delete bumps), then the database. A warm request makes no query,
no cache call and no Redis call; a cold one reads the shared cache within the time budget. Code on an
event loop reads inside `local_only()`, where a lookup that would block raises `NeedsIO`. Raw API keys
are never cached: entries are keyed by the key's prefix and hold its hash (docs/operations.md)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import uuid
from collections.abc import Callable
from typing import Any

from django.core.cache import BaseCache, caches
from django.core.cache.backends.dummy import DummyCache
from django.core.cache.backends.locmem import LocMemCache
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models.signals import post_delete, post_save

from ..conf.settings import SettingsCached, ratelimit_settings
from ..core.clientrules import ClientRules
from ..service.bounded import bounded_calls
from .compile import (
    KeyInfo,
    TierInfo,
    apply_overrides,
    build_tier,
    load_client_rules,
    load_key_row,
    load_tier_row,
    load_user_plan,
)
from .edits import EditWatch
from .localcache import MISS, LocalCache

#: Lifetime of the rows kept in the shared Django cache. Changes made through the ORM (admin, shell,
#: signals) are announced at once; changes that bypass signals (`QuerySet.update`, raw SQL) apply once
#: this runs out, or at the next `invalidate()`.
_SHARED_TTL = 300

#: Cache backends whose entries only their own process sees: no use as the shared layer.
_PER_PROCESS_CACHES = (LocMemCache, DummyCache)

logger = logging.getLogger("ratelimit_app")

_local_only = contextvars.ContextVar("ratelimit_local_only", default=False)


class NeedsIO(Exception):
    """Raised inside `local_only()` by a lookup this process has not cached (see `local_only`)."""


class _LocalOnly:
    """The context manager `local_only()` returns (a class, not a generator: it runs on every async request)."""

    __slots__ = ("token",)

    def __enter__(self) -> None:
        self.token = _local_only.set(True)

    def __exit__(self, *exc_info: object) -> None:
        _local_only.reset(self.token)


def local_only() -> _LocalOnly:
    """Within this block (in this context: thread or asyncio task), lookups answer from this process'
    cache or raise NeedsIO; so does `require_io()`. Async request handling plans a request inside it,
    and redoes the plan with `sync_to_async` when NeedsIO is raised."""
    return _LocalOnly()


def require_io() -> None:
    """Raise NeedsIO inside `local_only()`: the caller is about to do I/O (a lookup, a Redis peek)."""
    if _local_only.get():
        raise NeedsIO


class Lookups:
    """The three-layer lookup service (see the module docstring). One instance serves a process;
    tests build a second one to play a second app server sharing the same database and Django cache.
    """

    def __init__(self, *, cache_ttl: float, local_size: int, negative_size: int, cache_alias: str,
                 namespace: str, budget: float) -> None:
        self.local = LocalCache(local_size, cache_ttl)
        self.negative = LocalCache(negative_size, cache_ttl)
        self.cache_alias = cache_alias
        self.namespace = namespace
        #: seconds a lookup waits for the shared cache at most (RATELIMIT['BUDGET_MS'])
        self.budget = budget
        #: the edits other processes announce (ratelimit_app.plans.edits), and how many this one has applied
        self.edits = EditWatch(namespace)
        self._edits_applied = 0

    # -- public ----------------------------------------------------------------------------------
    # `fresh=False`: the caller has checked for edits during this request already (`client_rules`, the first
    # lookup of every plan, does): the edit epoch is read once per request, not once per lookup.
    def tier(self, slug: str, *, fresh: bool = True) -> TierInfo | None:
        """The tier named `slug`, or None when no such tier exists."""
        return self._cached("tier", slug, load_tier_row, lambda row: build_tier(row) if row is not None else None,
                            fresh)

    def cached_key(self, prefix: str, *, fresh: bool = True) -> Any:
        """The key with `prefix` if this process has it cached (KeyInfo, or None for unknown), else MISS;
        never does I/O."""
        if fresh:
            self._fresh()
        value = self.local.get(("key", prefix))
        if value is MISS and self.negative.get(prefix) is not MISS:
            return None
        return value

    def key(self, prefix: str) -> KeyInfo | None:
        """The API key with `prefix` (whatever its state), or None when no key has that prefix."""
        value = self.cached_key(prefix)
        if value is MISS:
            generations = self.local.generation, self.negative.generation
            row = self._shared("key", prefix, load_key_row, cache_missing=False)
            if row is None:
                self.negative.set(prefix, True, generations[1])
                return None
            value = KeyInfo(*row)
            self.local.set(("key", prefix), value, generations[0])
        return value

    def user_plan(self, user_pk: Any) -> tuple[str | None, tuple[tuple[Any, ...], ...]]:
        """The tier slug assigned to user `user_pk` (None when none is) and the user's own limits
        (UserTierLimit rows, as `KeyInfo.overrides`)."""
        return self._cached("userplan", str(user_pk), load_user_plan, lambda row: row or (None, ()))

    def with_overrides(self, owner: str, tier: TierInfo, overrides: tuple[tuple[Any, ...], ...]) -> TierInfo:
        """`tier` with the limits of `overrides` replacing or adding to its own (see `apply_overrides`),
        cached per `owner` (a key prefix or a user) for as long as `tier` is the tier this process holds."""
        if not overrides:
            return tier
        local_key = ("merged", owner)
        cached = self.local.get(local_key)
        if cached is not MISS and cached[0] is tier and cached[1] == overrides:
            return cached[2]
        merged = apply_overrides(tier, overrides, owner)
        self.local.set(local_key, (tier, overrides, merged))
        return merged

    def client_rules(self) -> ClientRules:
        """The enabled allow/deny rules (ClientRule), compiled."""
        return self._cached("rules", "all", load_client_rules, lambda rows: ClientRules.build(rows or ()))

    def clear_local(self) -> None:
        """Forget everything cached in this process."""
        self.local.clear()
        self.negative.clear()

    def forget(self) -> None:
        """Reload from the database: this process right away, and every process that reads the shared
        cache (its generation is bumped). Other processes are not told: see `invalidate`."""
        cache = self._cache()
        if cache is not None:
            try:
                cache.set(self._generation_key, uuid.uuid4().hex, timeout=None)
            except Exception as exc:  # a cache outage must not fail an admin save
                logger.warning(
                    "ratelimit: could not invalidate the shared lookup cache (%s); app servers that read it "
                    "apply the change within %s seconds", exc, _SHARED_TTL,
                )
        self.clear_local()

    def invalidate(self) -> None:
        """`forget`, and announce the edit through the limiter's Redis: every app server reloads within
        about a second (within CACHE_TTL when Redis does not answer). Run it after the change is
        committed (the module's `invalidate()` waits for the commit)."""
        self.forget()
        self.edits.announce()

    # -- internals -------------------------------------------------------------------------------
    def _cached(self, kind: str, name: str, load: Callable[[str], Any], build: Callable[[Any], Any],
                fresh: bool = True) -> Any:
        """`kind:name` from this process' cache, else `build` of its row (`_shared`), cached."""
        if fresh:
            self._fresh()
        value = self.local.get((kind, name))
        if value is MISS:
            generation = self.local.generation
            value = build(self._shared(kind, name, load))
            self.local.set((kind, name), value, generation)
        return value

    def _fresh(self) -> None:
        """Forget everything cached when the edit reader saw an edit announced since the last lookup. The
        first lookup of a process reads the edit epoch and starts that reader (see
        ratelimit_app.plans.edits): I/O, so NeedsIO inside `local_only()`; later lookups do none."""
        edits = self.edits
        if not edits.reading():
            require_io()
            edits.start()
        seen = edits.changes
        if seen != self._edits_applied:
            self._edits_applied = seen
            self.clear_local()

    @property
    def _generation_key(self) -> str:
        return f"{self.namespace}:lookups:generation"

    def _cache(self) -> BaseCache | None:
        """The shared layer: the Django cache CACHE_ALIAS names, None when it is no such thing (no such
        alias, or a cache of this process alone)."""
        try:
            cache = caches[self.cache_alias]
        except Exception:  # no such alias: run without the shared layer
            return None
        return None if isinstance(cache, _PER_PROCESS_CACHES) else cache

    def _shared(self, kind: str, name: str, load: Any, *, cache_missing: bool = True) -> Any:
        """Read `kind:name` from the shared cache, else load it from the database and share it (raises
        NeedsIO inside `local_only()`). The cache is read, and written, within the time budget
        (ratelimit_app.service.bounded): a cache that hangs costs a lookup at most BUDGET_MS."""
        require_io()
        epoch = self.edits.seen  # (read here: the shared cache is read on another thread)
        try:
            entry_key, found = bounded_calls.call(lambda: self._read_shared(kind, name, epoch), self.budget)
        except Exception:  # the cache is an optimisation; the database is the truth
            entry_key, found = None, _MISSING_MARKER
        if found != _MISSING_MARKER:
            return _from_shared(found)
        row = load(name)
        if entry_key is not None and (row is not None or cache_missing):
            with contextlib.suppress(Exception):  # sharing is an optimisation
                bounded_calls.call(lambda: self._write_shared(entry_key, row), self.budget)
        return row

    def _read_shared(self, kind: str, name: str, epoch: str) -> tuple[str | None, Any]:
        """(the shared entry's key, its value or _MISSING_MARKER); (None, _MISSING_MARKER) without a cache.
        Entries are shared under the cache's generation and the edit epoch `epoch` (the one this process
        last read): a process that has read a newer epoch never reads an entry stored before it."""
        cache = self._cache()
        if cache is None:
            return None, _MISSING_MARKER
        generation = cache.get(self._generation_key)
        if generation is None:
            cache.add(self._generation_key, uuid.uuid4().hex, timeout=None)
            generation = cache.get(self._generation_key)
        entry_key = f"{self.namespace}:lookups:{generation}:{epoch}:{kind}:{name}"
        return entry_key, cache.get(entry_key, _MISSING_MARKER)

    def _write_shared(self, entry_key: str, row: Any) -> None:
        cache = self._cache()
        if cache is not None:
            cache.set(entry_key, _to_shared(row), timeout=_SHARED_TTL)


#: Stored in the shared cache for "does not exist" (None cannot be told apart from a cache miss).
_MISSING_MARKER = "__ratelimit_missing__"


def _to_shared(row: Any) -> Any:
    return _MISSING_MARKER + ":none" if row is None else row


def _from_shared(value: Any) -> Any:
    return None if value == _MISSING_MARKER + ":none" else value


# -- the process-wide instance ---------------------------------------------------------------------
def build_lookups() -> Lookups:
    """A new Lookups configured from settings.RATELIMIT (the process uses `get_lookups()`)."""
    return Lookups(
        cache_ttl=ratelimit_settings.CACHE_TTL,
        local_size=ratelimit_settings.LOCAL_CACHE_SIZE,
        negative_size=ratelimit_settings.NEGATIVE_CACHE_SIZE,
        cache_alias=ratelimit_settings.CACHE_ALIAS,
        namespace=ratelimit_settings.KEY_PREFIX,
        budget=float(ratelimit_settings.BUDGET_MS) / 1000,
    )


_lookups = SettingsCached(build_lookups)


def get_lookups() -> Lookups:
    """The lookup service of this process (created on first use from settings, rebuilt after every
    settings change)."""
    return _lookups.get()


def invalidate(using: str = DEFAULT_DB_ALIAS) -> None:
    """Apply a change of tiers, limits, keys, user tiers, overrides or client rules on every app server
    (within about a second; inside a transaction of database `using`, once it commits). ORM saves and
    deletes call it; call it yourself after changes that bypass signals (`QuerySet.update()`, raw SQL)."""
    lookups = get_lookups()
    if transaction.get_connection(using).in_atomic_block:
        # now for this process; again after commit: a server that reloaded between now and the commit
        # read the old rows, and the second bump and the announcement make what it holds unreachable
        lookups.forget()
        transaction.on_commit(_invalidate_committed, using=using)
    else:
        lookups.invalidate()


def _invalidate_committed() -> None:
    get_lookups().invalidate()


def _on_model_change(sender: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> None:
    invalidate(using)


def connect_signals() -> None:
    """Invalidate the caches whenever a Tier, TierLimit, ApiKey, UserTier, one of their override limits
    or a ClientRule is saved or deleted."""
    from ..models import ApiKey, ApiKeyLimit, ClientRule, Tier, TierLimit, UserTier, UserTierLimit

    for model in (Tier, TierLimit, ApiKey, UserTier, ApiKeyLimit, UserTierLimit, ClientRule):
        for signal_name, signal in (("post_save", post_save), ("post_delete", post_delete)):
            signal.connect(_on_model_change, sender=model, dispatch_uid=f"ratelimit-{model.__name__}-{signal_name}")
