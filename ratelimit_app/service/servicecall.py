"""What the limiter services share besides their guard: the counters (`ServiceStats`), the deny-cache key of a
request (`request_key`), and the guard's steps (`Steps`, which each service drives)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

from ..core.engine import Check
from .breaker import BreakerState

T = TypeVar("T")


@dataclass(frozen=True)
class ServiceStats:
    """Counters of one process' guard since it was built (docs/operations.md, "The circuit breaker")."""

    breaker: BreakerState
    redis_failures: int
    degraded_open: int
    degraded_closed: int
    local_allowed: int
    local_denied: int
    deny_cache_hits: int
    deny_cache_size: int
    local_states: int

    @property
    def degraded(self) -> int:
        """Decisions answered without Redis, in every fail mode."""
        return self.degraded_open + self.degraded_closed + self.local_allowed + self.local_denied


def request_key(checks: Sequence[Check], cost: int) -> Hashable:
    """The deny-cache key of one request: its cost and every (identity, policy set), in order."""
    if len(checks) == 1:
        identity, policies = checks[0]
        return (cost, identity, policies if type(policies) is tuple else tuple(policies))
    parts: list[Any] = [cost]
    for identity, policies in checks:
        parts.append(identity)
        parts.append(tuple(policies))
    return tuple(parts)


#: One Redis call the guard's steps ask for, as (run, started): `run(engine)` makes it (sync), or returns what
#: to await (async; the memory backend's replies are not awaitable), with the budget counted from `started` (a
#: time.monotonic() value; None: from now). A plain tuple: one is made per decision.
Ask = tuple[Callable[[Any], Any], Optional[float]]  # noqa: UP045 (a runtime alias on Python 3.10)


#: The steps of one operation through the guard (sans-IO): each yields an Ask and is sent its reply, or
#: thrown what making it raised; what the generator returns is the operation's answer.
Steps = Generator[Ask, Any, T]
