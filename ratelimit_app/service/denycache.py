"""The local deny cache: a request Redis denied until T is denied in process until T, without Redis; and the
reset epoch that carries a reset to every process. Why it never denies what Redis would allow, and what
it costs: docs/operations.md, "The local deny cache"."""

from __future__ import annotations

import math
import secrets
import threading
from collections.abc import Hashable, Sequence
from typing import Any

from ..core.decision import Decision, PolicyResult

# Redis' clock and this process' monotonic clock may drift apart by a little; ending the local denial
# this fraction early keeps the cache from ever outlasting the denial Redis announced.
_CLOCK_MARGIN = 1e-3
# A cost above a policy's capacity is denied forever (retry_after = inf); remember it this long.
_NEVER_SECONDS = 60.0
#: Seconds between two reads of the reset epoch by one process (only while its deny cache answers).
RESET_CHECK_INTERVAL = 0.5
# The epoch key outlives any reset worth announcing; when it expires, processes clear once (harmless).
_EPOCH_TTL_SECONDS = 86400


class _Entry:
    """One cached denial, until `until` (monotonic seconds); `shifted`: its decisions as last shifted, with the
    whole milliseconds since `started` they were shifted by (None before the first lookup)."""

    __slots__ = ("decisions", "identities", "shifted", "started", "until")

    def __init__(self, until: float, started: float, decisions: tuple[Decision, ...],
                 identities: tuple[str, ...]) -> None:
        self.until, self.started, self.decisions, self.identities = until, started, decisions, identities
        self.shifted: tuple[int, list[Decision]] | None = None


class DenyCache:
    """Decisions of denied requests, keyed by the exact request (any hashable value naming its identities,
    policy sets and cost: servicecall.request_key), until their retry time. Thread-safe."""

    def __init__(self, size: int) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size: {size!r} must be an integer >= 1")
        self.size = size
        self._entries: dict[Hashable, _Entry] = {}
        self._lock = threading.Lock()
        self.hits = 0
        #: Changes whenever entries are dropped by `forget` or `clear`; a denial whose request started under
        #: an older generation is not remembered (it may predate the reset that caused the drop).
        self.generation = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable, now: float) -> list[Decision] | None:
        """The cached denial for `key`, its times shifted to `now`, or None (not denied, or expired)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if now >= entry.until:
            with self._lock:
                if self._entries.get(key) is entry:
                    del self._entries[key]
            return None
        self.hits += 1  # a statistic: an occasional lost increment under contention is acceptable
        elapsed_ms = int((now - entry.started) * 1000)
        shifted = entry.shifted  # (one read: another thread may replace it meanwhile, with an equal copy)
        if shifted is None or shifted[0] != elapsed_ms:
            shifted = (elapsed_ms, [_shift(decision, elapsed_ms / 1000) for decision in entry.decisions])
            entry.shifted = shifted
        return list(shifted[1])

    def remember(self, key: Hashable, identities: tuple[str, ...], decisions: Sequence[Decision],
                 started: float, generation: int | None = None) -> None:
        """Cache `decisions` (the answer to one request, started at `started`) if they are a denial by the
        request's own policies, until the longest retry_after among them; not when entries were dropped
        since `generation` (`self.generation` read before the request was sent)."""
        wait = 0.0
        for decision in decisions:
            if not decision.allowed and not decision.degraded and decision.retry_after is not None:
                wait = max(wait, decision.retry_after)
        if wait <= 0:
            return
        until = started + (_NEVER_SECONDS if math.isinf(wait) else wait * (1 - _CLOCK_MARGIN))
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            entries = self._entries
            if key not in entries and len(entries) >= self.size:
                for stale in [k for k, v in entries.items() if v.until <= started]:
                    del entries[stale]
                while len(entries) >= self.size:
                    del entries[next(iter(entries))]
            entries[key] = _Entry(until, started, tuple(decisions), identities)

    def forget(self, identity: str) -> int:
        """Drop every entry that involves `identity` (after a reset); returns how many were dropped."""
        with self._lock:
            stale = [k for k, v in self._entries.items() if identity in v.identities]
            for key in stale:
                del self._entries[key]
            self.generation += 1
        return len(stale)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.generation += 1


def reset_epoch_key(prefix: str) -> str:
    """The Redis key of the reset epoch for limiter keys under `prefix`."""
    return f"{prefix}:{{resets}}:epoch"


_UNSEEN = object()


class ResetWatch:
    """Learns whether any process reset an identity since this process last looked: `announce` runs after a
    reset; `due` and `changed` on the request path."""

    def __init__(self, prefix: str, interval: float = RESET_CHECK_INTERVAL) -> None:
        self.key = reset_epoch_key(prefix)
        self.interval = interval
        self._seen: Any = _UNSEEN
        self._next_check = 0.0
        self._lock = threading.Lock()

    def announce(self, client: Any) -> Any:
        """Tell every process that a reset happened (run it after the state was deleted in Redis). Returns
        what `client.set` returns: with a redis.asyncio client, the coroutine to await."""
        return client.set(self.key, secrets.token_hex(8), ex=_EPOCH_TTL_SECONDS)

    def due(self, now: float) -> bool:
        """True, for one caller per interval, when it is time to read the epoch (`client.get(self.key)`)."""
        if now < self._next_check:
            return False
        with self._lock:
            if now < self._next_check:
                return False
            self._next_check = now + self.interval
            return True

    def changed(self, epoch: Any) -> bool:
        """Record the epoch just read; True when it is not the one seen before. The first read counts as
        a change: a reset may have come between this process' first denial and that read."""
        with self._lock:
            previous, self._seen = self._seen, epoch
        return previous != epoch


def _shift_seconds(value: float | None, elapsed: float) -> float | None:
    if value is None or math.isinf(value):
        return value
    return max(value - elapsed, 0.001)


def _shift_results(results: tuple[PolicyResult, ...], elapsed: float) -> tuple[PolicyResult, ...]:
    return tuple(PolicyResult(r.policy, r.allowed, r.limit, r.remaining, max(r.reset_after - elapsed, 0.0),
                              _shift_seconds(r.retry_after, elapsed)) for r in results)


def _shift(decision: Decision, elapsed: float) -> Decision:
    """The same denial, as seen `elapsed` seconds after Redis made it (its shadow results too)."""
    return Decision(decision.allowed, decision.limit, decision.remaining, max(decision.reset_after - elapsed, 0.0),
                    _shift_seconds(decision.retry_after, elapsed), decision.policy,
                    _shift_results(decision.results, elapsed), decision.degraded,
                    _shift_results(decision.shadow, elapsed) if decision.shadow else ())
