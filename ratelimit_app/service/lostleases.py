"""Concurrency slots that nobody could give back while Redis did not answer (a decision whose reply was lost, a
release Redis could not take), given back from a thread of their own once Redis answers: a lost decision's
lease is cancelled (lua/cancel.lua), a failed release sent again (docs/operations.md, "What a lost reply
does to slots")."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.exceptions import BACKEND_ERRORS
from ..core.logs import log_event
from ..core.policies import Policy

#: Leases kept per process at most; beyond it the oldest are dropped (they free with their lease).
MAX_PENDING = 10_000
#: Seconds between attempts while Redis does not answer (the breaker's cooldown, when longer, instead).
RETRY_INTERVAL = 0.1

CANCEL = "cancel"
_RELEASE = "release"


@dataclass(frozen=True, slots=True)
class LostLease:
    """Slots of one lease token to cancel or release: `held` are (identity, concurrency policy) pairs;
    `until` is the monotonic time after which a release is pointless (its lease has run out)."""

    kind: str
    held: tuple[tuple[str, Policy], ...]
    lease: str
    until: float


#: Carries out one LostLease against Redis (within the budget, through the breaker): True when done.
_Attempt = Callable[[LostLease], bool]


class LostLeases:
    """The leases waiting for Redis to answer again: `attempt` sends one (RedisGuard._settle), `pause()` says
    how long to wait after a failed one. At most MAX_PENDING are kept (the oldest go first, logged once per
    outage)."""

    def __init__(self, attempt: _Attempt, pause: Callable[[], float]) -> None:
        self._attempt = attempt
        self._pause = pause
        self._pending: deque[LostLease] = deque()
        self._condition = threading.Condition()
        self._running_in = 0  # the pid whose thread is working through the list (0: none)
        self._dropped_logged = False

    def cancel(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Cancel `lease` on these slots once Redis answers (a decision whose reply was lost)."""
        self._add(LostLease(CANCEL, tuple(held), lease, float("inf")))

    def release(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Release `lease` from these slots once Redis answers, unless their lease has run out by then."""
        period = max((policy.period for _, policy in held), default=0)
        self._add(LostLease(_RELEASE, tuple(held), lease, time.monotonic() + period))

    def __len__(self) -> int:
        return len(self._pending)

    def settled(self, timeout: float) -> bool:
        """Wait until nothing is pending (at most `timeout` seconds); True when nothing is."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while self._pending or self._running_in == os.getpid():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._condition.wait(left)
        return True

    def _add(self, lost: LostLease) -> None:
        if not lost.held:
            return
        with self._condition:
            self._pending.append(lost)
            if len(self._pending) > MAX_PENDING:
                self._pending.popleft()
                if not self._dropped_logged:
                    self._dropped_logged = True
                    log_event("ratelimit.lost_leases_dropped", logging.WARNING, kept=MAX_PENDING)
            if self._running_in != os.getpid():  # none yet, or only the thread of the process we forked from
                self._running_in = os.getpid()
                threading.Thread(target=self._run, name="ratelimit-lost-leases", daemon=True).start()

    def _run(self) -> None:
        """Work through the list until it is empty; after a failed attempt, wait `pause()` seconds."""
        while True:
            with self._condition:
                if not self._pending:
                    self._running_in = 0
                    self._dropped_logged = False
                    self._condition.notify_all()
                    return
                lost = self._pending[0]
            if lost.kind == _RELEASE and time.monotonic() > lost.until:
                done = True
            else:
                try:
                    done = self._attempt(lost)
                except BACKEND_ERRORS:
                    done = False
                except Exception:  # a bug must not spin: dropped, its slots free with their lease
                    log_event("ratelimit.lost_lease_failed", logging.ERROR, kind=lost.kind)
                    done = True
            with self._condition:
                if done:
                    if self._pending and self._pending[0] is lost:
                        self._pending.popleft()
                    continue
                self._condition.wait(self._pause())
