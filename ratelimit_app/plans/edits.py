"""Edits of plans announced to every app server through the limiter's own Redis, whatever CACHES is.

A process that saves or deletes a plan row (a Tier, TierLimit, ApiKey, UserTier, limit override or
ClientRule: the admin, any ORM save or delete, a management command, or `lookups.invalidate()` after a
`QuerySet.update()`) writes a new random token to one small key, `<KEY_PREFIX>:{edits}:epoch`, once the
change is committed. Every process reads that key at most once per EDITS_CHECK_INTERVAL (1 s): the first
lookup after the interval has run out reads it, within the limiter's time budget (an event loop hands
that lookup to a thread, see `lookups.local_only`); when the token is not the one it saw last, the
process forgets its cached lookups. So an edit is enforced by every app server about a second after it
is committed, at the cost of one GET per second per busy process, never one per request.

When Redis does not answer, or the limiter's circuit breaker is open, nothing is read or written and
each process applies edits once its cached entries expire (RATELIMIT['CACHE_TTL']).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any

from ..core.exceptions import BACKEND_ERRORS
from ..service.limiter import get_limiter

#: Seconds between two reads of the edit epoch by one process (only while it looks things up).
EDITS_CHECK_INTERVAL = 1.0
# The epoch key outlives any edit worth announcing; when it expires, processes forget once (harmless).
_EPOCH_TTL_SECONDS = 86400

logger = logging.getLogger("ratelimit_app")

#: The epoch before this process has read one (differs from every value Redis can hold).
UNSEEN = "-"


def edits_key(prefix: str) -> str:
    """The Redis key of the edit epoch for a limiter whose keys are under `prefix`."""
    return f"{prefix}:{{edits}}:epoch"


class EditWatch:
    """One process' view of the edit epoch of one key prefix (see the module docstring).

    `due(now)` is the request path's test (no lock, no I/O); `check()` reads the epoch when it is due
    (one caller per interval); `announce()` writes a new one. `seen` is the last epoch read, UNSEEN
    before the first read: lookups shared between processes are stored under it.
    """

    def __init__(self, prefix: str, interval: float | None = None) -> None:
        self.key = edits_key(prefix)
        self.interval = EDITS_CHECK_INTERVAL if interval is None else interval
        self.seen = UNSEEN
        self._next_check = 0.0
        self._lock = threading.Lock()

    def due(self, now: float) -> bool:
        """True when the epoch should be read before the next cached answer (`check`)."""
        return now >= self._next_check

    def check(self) -> bool:
        """Read the epoch, if it is still due (one caller per interval; the others return at once).

        True when it differs from the one read before, or is read for the first time (an edit may have
        come before the first read). False when Redis could not be asked: cached entries then expire
        after CACHE_TTL.
        """
        with self._lock:
            now = time.monotonic()
            if now < self._next_check:
                return False
            self._next_check = now + self.interval
        try:
            value = get_limiter().call_redis(lambda client: client.get(self.key))
        except BACKEND_ERRORS as exc:
            logger.debug("ratelimit: could not read the edit epoch (%s)", exc)
            return False
        epoch = _text(value)
        with self._lock:
            previous, self.seen = self.seen, epoch
        return previous != epoch

    def announce(self) -> bool:
        """Tell every process that plans changed (run it after the change is committed). False, with a
        warning logged, when Redis could not be told."""
        token = secrets.token_hex(8)
        try:
            get_limiter().call_redis(lambda client: client.set(self.key, token, ex=_EPOCH_TTL_SECONDS))
        except BACKEND_ERRORS as exc:
            logger.warning(
                "ratelimit: could not announce an edit of tiers, keys or rules through Redis (%s); other app "
                "servers apply it when their cached lookups expire (RATELIMIT['CACHE_TTL'])", exc,
            )
            return False
        return True


def _text(value: Any) -> str:
    """The epoch as stored (bytes from a client without decode_responses), "" when the key is absent."""
    if value is None:
        return ""
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
