"""What a limiter service keeps about its decisions: its counters (`ServiceStats`), and one decision
on its way through the service (`ServiceCall`), shared by the sync service (ratelimit_app.service.limiter)
and the async one (ratelimit_app.service.limiter_async)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.decision import Decision
from ..core.engine import Check
from .breaker import CALL, BreakerState
from .denycache import ResetWatch


@dataclass(frozen=True)
class ServiceStats:
    """Counters of one LimiterService since it was built (per process).

    `degraded` counts decisions answered without Redis (by fail mode: `degraded_open`,
    `degraded_closed`, `local_allowed`, `local_denied`); `redis_failures` calls that failed or timed
    out; `deny_cache_hits` requests denied in process; `local_states` states held by the fallback.
    """

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


class ServiceCall:
    """One decision on its way through a service: what was asked, and what the service knows so far."""

    __slots__ = ("answer", "charge", "checks", "cost", "generation", "key", "lease", "mode", "started", "step",
                 "watch")

    def __init__(self, checks: Sequence[Check], cost: int, mode: str, charge: bool,
                 lease: str | None = None) -> None:
        self.checks = checks
        self.cost = cost
        self.mode = mode
        self.charge = charge
        #: the token concurrency slots are taken under (see LimiterService.hit_many)
        self.lease = lease
        #: the deny-cache key, when it was computed
        self.key: Hashable | None = None
        #: the decisions, when known without asking Redis (deny cache, breaker open)
        self.answer: list[Decision] | None = None
        #: set when the reset epoch must be read before a cached answer stands (see LimiterService._open)
        self.watch: ResetWatch | None = None
        #: the deny cache's generation before Redis was asked
        self.generation = 0
        #: the breaker's CALL or PROBE
        self.step = CALL
        self.started = 0.0
