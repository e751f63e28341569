"""Blocking calls into code that owns its sockets (Django's cache), waited for no longer than the time budget:
`bounded_calls.call(fn, seconds)` runs `fn` on a thread of its own. While a call is overdue (still running
after its caller stopped waiting) no other starts, so a hung server costs one budget, then nothing, and
never piles up threads (docs/operations.md, "Time budget and timeouts")."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

T = TypeVar("T")

#: Calls run at once at most (each on a thread of its own); a call beyond them is not started.
MAX_THREADS = 8


class Unavailable(Exception):
    """The call did not finish within its time, or was not started (an earlier call is overdue, or every
    thread is busy)."""


class _Call:
    """One call on its way: whether its caller stopped waiting for it, and whether it has finished."""

    __slots__ = ("finished", "overdue")

    def __init__(self) -> None:
        self.overdue = False
        self.finished = False


class BoundedCalls:
    """Runs blocking calls on threads of its own (made on first use in each process), waiting for each at
    most a given time."""

    def __init__(self) -> None:
        self._forked()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """A new process (or this one's start): no thread, no call of the parent's is ours."""
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._running = 0
        self._overdue = 0

    def call(self, fn: Callable[[], T], seconds: float) -> T:
        """`fn()`, if it returns within `seconds`; else Unavailable (it goes on in its thread)."""
        call = _Call()
        future = self._start(fn, call)
        try:
            return future.result(timeout=seconds)
        except FutureTimeout:
            with self._lock:
                if not call.finished:
                    call.overdue = True
                    self._overdue += 1
            raise Unavailable(f"no answer within {seconds * 1000:.0f} ms") from None

    @property
    def overdue(self) -> int:
        """Calls whose caller stopped waiting and that have not finished yet (in this process)."""
        return self._overdue

    def _start(self, fn: Callable[[], T], call: _Call) -> Future[T]:
        with self._lock:
            if self._overdue:
                raise Unavailable("an earlier call has not answered yet")
            if self._running >= MAX_THREADS:
                raise Unavailable("every thread is busy")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="ratelimit-bounded")
            self._running += 1
            executor = self._executor
        return executor.submit(self._run, fn, call)

    def _run(self, fn: Callable[[], T], call: _Call) -> T:
        try:
            return fn()
        finally:
            with self._lock:
                call.finished = True
                self._running -= 1
                if call.overdue:
                    self._overdue -= 1


bounded_calls = BoundedCalls()
