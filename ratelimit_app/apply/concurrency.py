"""Concurrency slots of a request: taken in the request's one decision, given back when its response is done.

A concurrency policy (a tier limit, `@limit_concurrency`, `ConcurrencyThrottle`) makes each admitted
request hold one slot, a lease in Redis (core/lua/concurrency.lua). `limiting.decide` returns the slots
taken as `LimitOutcome.slots`; the admission path holds them and gives them back when the response is
closed, at once when the view raised, under ASGI once a cancelled request's sync view has returned, when
the response is dropped unclosed (a safety net, by a thread of its own), and in any case when the lease
runs out. A gateway's slots go to the gateway in a signed lease (`HeldSlots.renew`). Giving back is one
pipelined round trip after the response is sent, and never fails a response (docs/protection.md).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

from django.http import HttpResponseBase

from ..conf.snapshot import request_settings
from ..core.policies import CONCURRENCY, Policy


class HeldSlots:
    """The concurrency slots one request holds: (identity, policy) pairs under one lease token; `local` when
    the local fail mode took them (they live in this process). `release()` gives them back once."""

    __slots__ = ("__weakref__", "_lock", "held", "local", "released", "token")

    def __init__(self, token: str, held: tuple[tuple[str, Policy], ...], local: bool) -> None:
        self.token = token
        self.held = held
        self.local = local
        self.released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        """Give the slots back (once; never raises: a slot not given back frees itself with its lease)."""
        with self._lock:
            if self.released:
                return
            self.released = True
        from ..service.limiter import get_limiter

        with contextlib.suppress(Exception):
            get_limiter().release(self.held, self.token, local=self.local)

    async def arelease(self) -> None:
        """`release` on the event loop, through the async service (never raises either)."""
        with self._lock:
            if self.released:
                return
            self.released = True
        from ..service.limiter_async import get_async_limiter

        with contextlib.suppress(Exception):
            await get_async_limiter().release(self.held, self.token, local=self.local)

    def renew(self, seconds: float | None = None) -> bool | None:
        """Make the slots end `seconds` from now (at most each one's lease period), or a full period from
        now (None): True when every slot was still held, False when the lease of one had ended (given back
        or run out: it is not taken again), None when Redis could not be asked (the slots keep the end they
        had). Never raises."""
        if self.released:
            return False
        from ..service.limiter import get_limiter

        try:
            return get_limiter().renew(self.held, self.token, lease_ms(seconds), local=self.local)
        except Exception:
            return None

    async def arenew(self, seconds: float | None = None) -> bool | None:
        """`renew` on the event loop, through the async service (never raises either)."""
        if self.released:
            return False
        from ..service.limiter_async import get_async_limiter

        try:
            return await get_async_limiter().renew(self.held, self.token, lease_ms(seconds), local=self.local)
        except Exception:
            return None

    def __repr__(self) -> str:
        names = ", ".join(policy.name for _, policy in self.held)
        return f"HeldSlots({names}; {'released' if self.released else 'held'})"


def lease_ms(seconds: float | None) -> int | None:
    """`seconds` as whole milliseconds (at least 1) for a renewal; None stays None (a full period)."""
    return None if seconds is None else max(1, round(seconds * 1000))


def slots_taken(checks: Sequence[tuple[str, Sequence[Policy]]], decisions: Sequence[Any],
                token: str | None) -> HeldSlots | None:
    """The slots the allowed decisions among `decisions` took under `token` (None when they took none).

    A decision of the "open" fail mode knows no policy results and took nothing; one of the "local"
    fail mode (degraded, with results) took its slots in this process.
    """
    if token is None:
        return None
    held: list[tuple[str, Policy]] = []
    local = False
    for (identity, policies), decision in zip(checks, decisions, strict=False):
        if decision is None or not decision.allowed or not decision.results:
            continue
        local = local or decision.degraded
        held += [(identity, policy) for policy in policies if policy.algorithm == CONCURRENCY]
    return HeldSlots(token, tuple(held), local) if held else None


def needs_lease(policies: Sequence[Policy]) -> bool:
    """True when a decision over `policies` takes a concurrency slot."""
    # a plain loop: cheaper than a cache, whose key would hash every policy of the set
    for policy in policies:
        if policy.algorithm == CONCURRENCY:
            return True
    return False


def release_with(response: HttpResponseBase, slots: HeldSlots | None) -> None:
    """Give `slots` back when `response` is closed (or dropped unclosed)."""
    if slots is None or slots.released:
        return
    cast(Any, response)._resource_closers.append(slots.release)  # called by HttpResponseBase.close()
    _releaser.start()
    # A response dropped unclosed may be collected anywhere, even inside a lock the release would take
    # (a garbage collection runs in whatever code allocates): the finalizer only queues the slots
    # (SimpleQueue.put is safe there) and the releasing thread gives them back.
    weakref.finalize(response, _releaser.queue.put, slots.release)


class _Releaser:
    """A daemon thread that gives back the slots of responses dropped unclosed (see `release_with`), and
    runs what `call_later` gives it; started on first use in each process (a forked child starts its own)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._pid = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():
                self.queue = queue.SimpleQueue()  # a forked child's copy may hold its parent's slots
                threading.Thread(target=self._run, args=(self.queue,), name="ratelimit-slot-releaser",
                                 daemon=True).start()
                self._pid = os.getpid()

    @staticmethod
    def _run(work_queue: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            work_queue.get()()  # never raises (a release, a request's closer)


_releaser = _Releaser()


def middleware_installed() -> bool:
    """True when RateLimitMiddleware is in MIDDLEWARE."""
    return request_settings().middleware_installed


def call_later(work: Callable[[], None]) -> None:
    """Have the releasing thread call `work` (which never raises: a release of slots, a request's closer),
    from code that must not block, such as a callback on the event loop."""
    _releaser.start()
    _releaser.queue.put(work)
