"""Edits of plans announced to every app server through the limiter's own Redis, whatever CACHES is: the
edit epoch, written when a plan row's change commits and read once a second by a thread of each process
(docs/operations.md, "Edits reach every app server")."""

from __future__ import annotations

import logging
import os
import secrets
import threading
import weakref
from typing import Any

from ..core.exceptions import BACKEND_ERRORS
from ..service.limiter import LimiterService, get_limiter

#: Seconds between two reads of the edit epoch by one process.
EDITS_CHECK_INTERVAL = 1.0
# The epoch key outlives any edit worth announcing; when it expires, processes forget once (harmless).
_EPOCH_TTL_SECONDS = 86400

logger = logging.getLogger("ratelimit_app")

#: The epoch before this process has read one (differs from every value Redis can hold).
UNSEEN = "-"

# Forks of this process so far: a forked child has no reader thread, and starts its own.
_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_count_fork)


def edits_key(prefix: str) -> str:
    """The Redis key of the edit epoch for a limiter whose keys are under `prefix`."""
    return f"{prefix}:{{edits}}:epoch"


class EditWatch:
    """One process' view of the edit epoch of one key prefix (see the module docstring).

    `reading()` tells whether this process' reader runs (cheap: the lookups ask on every lookup);
    `start()` reads the epoch once, as the baseline, and starts the reader, which calls `check()` once
    per `interval` until this watch is garbage. `changes` counts the epochs read that differ from the
    one before (a first successful read after a failed baseline counts: an edit may have come before
    it), and `seen` is the last epoch read (UNSEEN before the first), under which lookups share entries
    with other processes. `announce()` writes a new epoch. Both go through `limiter` (None: this
    process' `get_limiter()` as the settings are now): its Redis, time budget and breaker.
    """

    def __init__(self, prefix: str, interval: float | None = None, limiter: LimiterService | None = None) -> None:
        self.key = edits_key(prefix)
        self.limiter = limiter or get_limiter()
        self.interval = EDITS_CHECK_INTERVAL if interval is None else interval
        self.seen = UNSEEN
        self.changes = 0
        self._reader_forks: int | None = None  # the fork count when this process' reader started
        self._lock = threading.Lock()
        self._stop = threading.Event()  # set when this watch is garbage: its reader then ends
        weakref.finalize(self, self._stop.set)

    def reading(self) -> bool:
        """True when this process' reader thread has been started (a forked child starts its own)."""
        return self._reader_forks == _forks

    def start(self) -> None:
        """Read the epoch now, as the baseline (nothing was cached before it: no change is counted),
        and start this process' reader thread; nothing when it was started already. The read waits at
        most the limiter's time budget."""
        with self._lock:
            if self._reader_forks == _forks:
                return
            epoch = self._read()
            if epoch is not None:
                self.seen = epoch
            self._reader_forks = _forks
        reader = threading.Thread(target=_read_epochs, args=(weakref.ref(self), self._stop, self.interval),
                                  name="ratelimit-edits", daemon=True)
        try:
            reader.start()
        except RuntimeError:  # the interpreter is shutting down: the cache's TTL still applies
            return

    def check(self) -> bool:
        """Read the epoch once: True when it differs from the one read before (or from none, when the
        baseline could not be read). False when Redis could not be asked (cached entries then expire
        after CACHE_TTL)."""
        epoch = self._read()
        if epoch is None:
            return False
        with self._lock:
            if epoch == self.seen:
                return False
            self.seen = epoch
            self.changes += 1
        return True

    def _read(self) -> str | None:
        """The epoch in Redis ("" when there is none), or None when Redis could not be asked."""
        try:
            value = self.limiter.call_redis(lambda client: client.get(self.key))
        except BACKEND_ERRORS as exc:
            logger.debug("ratelimit: could not read the edit epoch (%s)", exc)
            return None
        return _text(value)

    def announce(self) -> bool:
        """Tell every process that plans changed (run it after the change is committed). False, with a
        warning logged, when Redis could not be told."""
        token = secrets.token_hex(8)
        try:
            self.limiter.call_redis(lambda client: client.set(self.key, token, ex=_EPOCH_TTL_SECONDS))
        except BACKEND_ERRORS as exc:
            logger.warning(
                "ratelimit: could not announce an edit of tiers, keys or rules through Redis (%s); other app "
                "servers apply it when their cached lookups expire (RATELIMIT['CACHE_TTL'])", exc,
            )
            return False
        return True


def _read_epochs(watch: weakref.ref[EditWatch], stop: threading.Event, interval: float) -> None:
    """The reader thread: `check()` the watch every `interval` seconds while it exists (holding it only
    during each read, so that it can be collected meanwhile)."""
    while not stop.wait(interval):
        current = watch()
        if current is None:
            return
        try:
            current.check()
        except Exception:  # never let the reader die of a surprise: log it, and read again next time
            logger.exception("ratelimit: reading the edit epoch failed")
        del current


def _text(value: Any) -> str:
    """The epoch as stored (bytes from a client without decode_responses), "" when the key is absent."""
    if value is None:
        return ""
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
