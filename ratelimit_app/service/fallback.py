"""The in-process limiter, `LocalLimiter`: the algorithms of ratelimit_app/core/lua in Python (the models of
fallback_models.py), with the same all-or-nothing decision over several policies and the same replies.
It serves the "local" fail mode (each server enforces its share of every policy, see `local_share`) and
the memory backend; with `app_servers=1` it decides as Redis does (tests/service/test_fallback_models.py).
Thread-safe and bounded (docs/operations.md, "Fail modes")."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

from ..core.algorithms import CALENDAR_WINDOW
from ..core.decision import Decision, PolicyResult, all_or_nothing
from ..core.engine import Check, Usage
from ..core.keys import identity_digest
from ..core.policies import BURST_ALGORITHMS, CONCURRENCY, Policy
from .fallback_models import MODELS, Store

#: A clock returning microseconds since the Unix epoch (the scripts use Redis TIME the same way).
Clock = Callable[[], int]

_DEFAULT_MAX_KEYS = 100_000
_DEFAULT_MAX_UNITS = 1_000_000


def _wall_clock_us() -> int:
    """Microseconds since the Unix epoch from this machine's clock (windows align to the epoch)."""
    return time.time_ns() // 1000


def local_share(policy: Policy, app_servers: int) -> tuple[float, float, float]:
    """(limit, period_ms, capacity) that one of `app_servers` servers enforces for `policy` (docs/operations.md,
    "Fail modes"; never below 1). A calendar quota gets its share of the limit, its calendar rule and its clock
    shift, as decide.lua passes them to calendar_window.lua."""
    if policy.calendar:
        return float(max(policy.limit // app_servers, 1)), float(policy.calendar_rule), float(policy.clock_shift_ms)
    if app_servers == 1:
        return float(policy.limit), float(policy.period_ms), float(policy.capacity)
    if policy.algorithm in BURST_ALGORITHMS:
        return (float(policy.limit), float(policy.period_ms * app_servers),
                float(max(policy.capacity // app_servers, 1)))
    share = float(max(policy.limit // app_servers, 1))
    return share, float(policy.period_ms), share


class LocalLimiter:
    """Decides requests against policies in this process, with the semantics of the Lua engine and the API
    of `RateLimiter`. `clock` returns microseconds since the epoch; `app_servers` divides every policy (see
    `local_share`); `max_keys` bounds the states kept and `max_units` the entries of all sliding-window logs
    together (the least recently written state goes first, which can only admit more)."""

    def __init__(self, *, app_servers: int = 1, clock: Clock = _wall_clock_us,
                 max_keys: int = _DEFAULT_MAX_KEYS, max_units: int = _DEFAULT_MAX_UNITS) -> None:
        for name, value in (("app_servers", app_servers), ("max_keys", max_keys), ("max_units", max_units)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {value!r} must be an integer >= 1")
        self.app_servers = app_servers
        self.clock = clock
        self._store = Store(max_keys, max_units)
        self._lock = threading.Lock()

    def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1, *, lease: str | None = None,
            clock_shift_ms: int = 0) -> Decision:
        """Charge `cost` to every policy if all of them allow it; charge nothing otherwise."""
        return self.decide([(identity, policies)], cost, charge=True, lease=lease, clock_shift_ms=clock_shift_ms)[0]

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1, *, clock_shift_ms: int = 0) -> Decision:
        """Report what `hit` would decide for `cost`, charging nothing."""
        return self.decide([(identity, policies)], cost, charge=False, clock_shift_ms=clock_shift_ms)[0]

    def hit_many(self, checks: Sequence[Check], cost: int = 1, *, lease: str | None = None,
                 clock_shift_ms: int = 0, usage: Usage = ()) -> list[Decision]:
        """Decide several identities together, all-or-nothing across all of them (`lease`: the token
        concurrency slots are held under). `usage` is not reserved: a usage limit counts the cost here."""
        return self.decide(checks, cost, charge=True, lease=lease, clock_shift_ms=clock_shift_ms)

    def release(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Give back the concurrency slots held under `lease` (see RateLimiter.release)."""
        with self._lock:
            now_us = float(self.clock())
            for identity, policy in held:
                key = _state_key(identity_digest(identity), policy)
                leases = self._store.get(key, now_us)
                if leases and lease in leases:
                    self._keep(key, {token: expiry for token, expiry in leases.items()
                                     if token != lease and expiry > now_us}, now_us)

    def renew(self, held: Sequence[tuple[str, Policy]], lease: str, lease_ms: int | None = None) -> int:
        """Make the live slots of `held` under `lease` end `lease_ms` from now (at most each policy's
        period; None: a full period from now); how many were live (see RateLimiter.renew)."""
        live = 0
        with self._lock:
            now_us = float(self.clock())
            for identity, policy in held:
                key = _state_key(identity_digest(identity), policy)
                leases = self._store.get(key, now_us) or {}
                if leases.get(lease, now_us) > now_us:
                    kept = {token: expiry for token, expiry in leases.items() if expiry > now_us}
                    length_ms = policy.period_ms if lease_ms is None else min(lease_ms, policy.period_ms)
                    kept[lease] = now_us + length_ms * 1000
                    self._keep(key, kept, now_us)
                    live += 1
        return live

    def _keep(self, key: str, leases: dict[str, float], now_us: float) -> None:
        """Store a concurrency state's leases (token -> expiry in us) until the last ends; none: delete it."""
        if leases:
            self._store.set(key, leases, (max(leases.values()) - now_us) / 1000, now_us, len(leases))
        else:
            self._store.delete(key)

    def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies."""
        digest = identity_digest(identity)
        with self._lock:
            for policy in policies:
                self._store.delete(_state_key(digest, policy))

    def clear(self) -> None:
        """Forget every state."""
        with self._lock:
            self._store.clear()

    def __len__(self) -> int:
        return len(self._store)

    def decide(self, checks: Sequence[Check], cost: int, *, charge: bool, lease: str | None = None,
               clock_shift_ms: int = 0) -> list[Decision]:
        """One all-or-nothing decision over every policy of every check (decide.lua); concurrency slots
        are taken under `lease`; the clock is `clock_shift_ms` later than `clock` says."""
        if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
            raise ValueError(f"cost: {cost!r} must be an integer >= 1")
        plan = []
        for identity, policies in checks:
            digest = identity_digest(identity)
            rows = []
            for policy in policies:
                if not isinstance(policy, Policy):
                    raise TypeError(f"policies: expected Policy objects, got {type(policy).__name__}")
                if charge and lease is None and policy.algorithm == CONCURRENCY:
                    raise ValueError("lease: this call takes a concurrency slot; pass lease=<token>")
                limit, period_ms, capacity = local_share(policy, self.app_servers)
                rows.append((policy, _state_key(digest, policy), limit, period_ms, capacity))
            plan.append(rows)
        fcost = float(cost)
        with self._lock:
            now_us = float(self.clock() + clock_shift_ms * 1000)
            outcomes = [[MODELS[_model_name(policy)](self._store, key, now_us, limit, period_ms, capacity, fcost,
                                                     *((lease,) if policy.algorithm == CONCURRENCY else ()))
                         for policy, key, limit, period_ms, capacity in rows] for rows in plan]
            all_allowed = all(outcome[0] or row[0].shadow for rows, per_check in zip(plan, outcomes, strict=True)
                              for row, outcome in zip(rows, per_check, strict=True))
            decisions = []
            for rows, per_check in zip(plan, outcomes, strict=True):
                results: list[PolicyResult] = []
                shadow: list[PolicyResult] = []
                for (policy, _, limit, _, capacity), (allowed, remaining, reset_us, retry_us, apply) in zip(
                        rows, per_check, strict=True):
                    capacity = limit if policy.calendar else capacity  # (a calendar's capacity slot is its shift)
                    if charge and all_allowed and allowed and apply is not None:
                        reset_us = apply()
                        remaining = remaining - (1.0 if policy.algorithm == CONCURRENCY else fcost)
                    (shadow if policy.shadow else results).append(
                        _result(policy.name, allowed, capacity, remaining, reset_us, retry_us))
                decisions.append(Decision.from_results(tuple(results), shadow=tuple(shadow)))
        return all_or_nothing(decisions)


def _model_name(policy: Policy) -> str:
    """The model that decides `policy`: its algorithm's, or for a calendar quota (a fixed_window policy
    whose windows are calendar periods) calendar_window's."""
    return CALENDAR_WINDOW.name if policy.calendar else policy.algorithm


def _state_key(digest: str, policy: Policy) -> str:
    """Where the state of `policy` for the identity of `digest` is kept (one per policy and model)."""
    return f"{digest}:{policy.name}:{_model_name(policy)}"


def _result(name: str, allowed: bool, capacity: float, remaining: float, reset_us: float,
            retry_us: float) -> PolicyResult:
    """One policy's result, rounded as decide.lua and engine.parse_reply round it."""
    # Lua numbers leave a script truncated to integers; decide.lua rounds times up to milliseconds
    reset_ms = math.ceil(reset_us / 1000)
    if allowed:
        retry_after = None
    elif retry_us < 0:
        retry_after = math.inf
    else:
        retry_after = int(max(1, math.ceil(retry_us / 1000))) / 1000.0
    return PolicyResult(name, allowed, int(capacity), max(int(remaining), 0), reset_ms / 1000.0, retry_after)
