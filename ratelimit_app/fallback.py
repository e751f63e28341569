"""The in-process limiter: the algorithms of ratelimit_app/lua, in Python, for Redis outages.

`LocalLimiter` mirrors the Lua scripts line by line: the same state, the same arithmetic (Lua numbers
are doubles, so this module computes in floats too, and rounds exactly where the scripts do), the same
all-or-nothing decision over several policies and the same replies. It serves two purposes:

- the `local` fail mode: while Redis is unavailable each app server enforces every policy divided by
  RATELIMIT['APP_SERVERS'] (`app_servers`), so the fleet as a whole stays near the real limit;
- a model of the Lua engine: with `app_servers=1` and an injected clock it must decide exactly as
  Redis does (tests/test_model_property.py checks this with hypothesis).

It is thread-safe (one lock per limiter) and its memory is bounded: at most `max_keys` states and at
most `max_units` sliding-window log entries (8 bytes each) are kept; the least recently written state
is dropped first (which can only make the limiter more lenient).
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from bisect import bisect_right, insort
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from .decision import Decision, PolicyResult
from .engine import Check, identity_digest
from .policies import BURST_ALGORITHMS, CONCURRENCY, Policy

#: A clock returning microseconds since the Unix epoch (the scripts use Redis TIME the same way).
Clock = Callable[[], int]
# allowed, remaining now, reset now (us), retry (us; 0 allowed, -1 never), apply (commit -> reset us)
Outcome = tuple[bool, float, float, float, Callable[[], float] | None]

DEFAULT_MAX_KEYS = 100_000
DEFAULT_MAX_UNITS = 1_000_000


#: The model of each algorithm, by name (filled by `@model`; tests/test_scripts.py checks that every
#: algorithm of ratelimit_app.algorithms has one).
MODELS: dict[str, Callable[..., Outcome]] = {}


def model(name: str) -> Callable[[Callable[..., Outcome]], Callable[..., Outcome]]:
    """Register the function below as the model of algorithm `name` (the mirror of its Lua file)."""
    def register(function: Callable[..., Outcome]) -> Callable[..., Outcome]:
        MODELS[name] = function
        return function
    return register


def wall_clock_us() -> int:
    """Microseconds since the Unix epoch from this machine's clock (windows align to the epoch)."""
    return time.time_ns() // 1000


class _Store:
    """Key -> state with a TTL (like the Redis keys the scripts write), bounded, least recently written out.

    Each state weighs 1, a sliding-window log its number of entries; the store keeps at most `max_keys`
    states and a total weight of at most `max_units` (always at least the newest state).
    """

    def __init__(self, max_keys: int, max_units: int) -> None:
        self.max_keys = max_keys
        self.max_units = max_units
        self.weight = 0
        self._data: OrderedDict[str, tuple[Any, float, int]] = OrderedDict()

    def get(self, key: str, now_us: float) -> Any:
        entry = self._data.get(key)
        if entry is None:
            return None
        # Redis drops a key once its time is past; a missing key means the same as the expired state
        if now_us >= entry[1]:
            self.delete(key)
            return None
        return entry[0]

    def set(self, key: str, value: Any, ttl_ms: float, now_us: float, weight: int = 1) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self.weight -= old[2]
        self._data[key] = (value, now_us + ttl_ms * 1000, weight)
        self.weight += weight
        while len(self._data) > 1 and (len(self._data) > self.max_keys or self.weight > self.max_units):
            _, (_, _, dropped) = self._data.popitem(last=False)
            self.weight -= dropped

    def delete(self, key: str) -> None:
        entry = self._data.pop(key, None)
        if entry is not None:
            self.weight -= entry[2]

    def clear(self) -> None:
        self._data.clear()
        self.weight = 0

    def __len__(self) -> int:
        return len(self._data)


@model("fixed_window")
def fixed_window(store: _Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
                 cost: float) -> Outcome:
    """ratelimit_app/lua/fixed_window.lua."""
    period_us = period_ms * 1000
    window = math.floor(now_us / period_us)
    reset_us = (window + 1) * period_us - now_us
    used: float = 0
    stored = store.get(key, now_us)
    if stored is not None and stored[0] == window:
        used = stored[1]
    remaining = max(limit - used, 0)
    if cost > capacity:
        return False, remaining, reset_us, -1, None
    if used + cost > limit:
        return False, remaining, reset_us, reset_us, None

    def apply() -> float:
        store.set(key, (window, used + cost), math.ceil(reset_us / 1000), now_us)
        return reset_us

    return True, remaining, reset_us, 0, apply


@model("sliding_window")
def sliding_window(store: _Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
                   cost: float) -> Outcome:
    """ratelimit_app/lua/sliding_window.lua (its log of 7-byte admission times is a sorted array here)."""
    period_us = period_ms * 1000
    window_start = now_us - period_us
    scores = store.get(key, now_us)
    if scores is None:
        scores = array("d")
    first_live = bisect_right(scores, window_start)
    used = len(scores) - first_live
    remaining = max(limit - used, 0)
    # (the script reads "reset now" lazily, only when it is reported; here it costs nothing)
    reset_us: float = scores[-1] + period_us - now_us if used > 0 else 0
    if cost > capacity:
        return False, remaining, reset_us, -1, None
    if used + cost > limit:
        oldest = scores[first_live + int(used + cost - limit - 1)]
        return False, remaining, reset_us, oldest + period_us - now_us, None

    def apply() -> float:
        # stamped no earlier than the newest unit, as the script does when a clock steps back
        stamp = max(now_us, scores[-1]) if used > 0 else now_us
        del scores[:bisect_right(scores, window_start)]
        for _ in range(int(cost)):
            insort(scores, stamp)
        store.set(key, scores, period_ms, now_us, len(scores))
        return period_us

    return True, remaining, reset_us, 0, apply


@model("sliding_window_counter")
def sliding_window_counter(store: _Store, key: str, now_us: float, limit: float, period_ms: float,
                           capacity: float, cost: float) -> Outcome:
    """ratelimit_app/lua/sliding_window_counter.lua."""
    period_us = period_ms * 1000
    window = math.floor(now_us / period_us)
    elapsed = now_us - window * period_us
    state = store.get(key, now_us)
    current: float = 0
    previous: float = 0
    if state is not None:
        if state[0] == window:
            current, previous = state[1], state[2]
        elif state[0] == window - 1:
            previous = state[1]
    weight = (period_us - elapsed) / period_us
    estimate = previous * weight + current
    remaining = max(math.floor(limit - estimate), 0)
    reset_us: float = 0
    if current > 0:
        reset_us = 2 * period_us - elapsed
    elif previous > 0:
        reset_us = period_us - elapsed
    if cost > capacity:
        return False, remaining, reset_us, -1, None
    if estimate + cost > limit:
        if current + cost <= limit:
            retry_us: float = math.ceil(period_us - elapsed - (limit - current - cost) * period_us / previous)
        else:
            retry_us = period_us - elapsed
            if current > 0:
                into_next = math.ceil(period_us - (limit - cost) * period_us / current)
                if into_next > 0:
                    retry_us = retry_us + into_next
        if retry_us < 1:
            retry_us = 1
        return False, remaining, reset_us, retry_us, None

    def apply() -> float:
        store.set(key, (window, current + cost, previous), math.ceil((2 * period_us - elapsed) / 1000), now_us)
        return 2 * period_us - elapsed

    return True, remaining, reset_us, 0, apply


@model("token_bucket")
def token_bucket(store: _Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
                 cost: float) -> Outcome:
    """ratelimit_app/lua/token_bucket.lua (the string "<units>:<stamp>" is a tuple here)."""
    now_ms = math.floor(now_us / 1000)
    full = capacity * period_ms
    state = store.get(key, now_us)
    if state is None:
        units, stamp = full, float(now_ms)
    else:
        units, stamp = state
    elapsed = max(now_ms - stamp, 0)
    units = units + elapsed * limit
    if units >= full:
        units = full
    stamp = stamp + elapsed
    remaining = math.floor(units / period_ms)
    reset_us = math.ceil((full - units) / limit) * 1000
    need = cost * period_ms
    if cost > capacity:
        return False, remaining, reset_us, -1, None
    if units < need:
        return False, remaining, reset_us, math.ceil((need - units) / limit) * 1000, None

    def apply() -> float:
        left = units - need
        to_full_ms = math.ceil((full - left) / limit)
        store.set(key, (left, stamp), to_full_ms, now_us)
        return to_full_ms * 1000

    return True, remaining, reset_us, 0, apply


@model("gcra")
def gcra(store: _Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
         cost: float) -> Outcome:
    """ratelimit_app/lua/gcra.lua."""
    interval = math.ceil(period_ms * 1000 / limit)
    tolerance = capacity * interval
    tat = store.get(key, now_us)
    if tat is None or tat < now_us:
        tat = now_us
    reset_us = tat - now_us
    remaining = max(math.floor((tolerance - reset_us) / interval), 0)
    if cost > capacity:
        return False, remaining, reset_us, -1, None
    new_tat = tat + cost * interval
    if new_tat - now_us > tolerance:
        return False, remaining, reset_us, new_tat - now_us - tolerance, None

    def apply() -> float:
        store.set(key, new_tat, math.ceil((new_tat - now_us) / 1000), now_us)
        return new_tat - now_us

    return True, remaining, reset_us, 0, apply


@model("concurrency")
def concurrency(store: _Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
                cost: float, lease: str | None = None) -> Outcome:
    """ratelimit_app/lua/concurrency.lua (the sorted set is a dict of lease token -> expiry in us)."""
    period_us = period_ms * 1000
    leases = store.get(key, now_us) or {}
    live = [expiry for expiry in leases.values() if expiry > now_us]
    used = len(live)
    remaining = max(limit - used, 0)
    if used + 1 > limit:
        return False, remaining, max(live) - now_us, 1_000_000, None

    def apply() -> float:
        kept = {token: expiry for token, expiry in leases.items() if expiry > now_us}
        kept[str(lease)] = now_us + period_us
        store.set(key, kept, period_ms, now_us, len(kept))
        return period_us

    return True, remaining, period_us if used else 0, 0, apply


def local_share(policy: Policy, app_servers: int) -> tuple[float, float, float]:
    """(limit, period_ms, capacity) that one of `app_servers` servers enforces for `policy`.

    Window algorithms get limit // app_servers per period. token_bucket and gcra keep their exact
    rate divided by app_servers (the period is stretched) and get capacity // app_servers as burst.
    Shares never drop below 1, so a limit smaller than the number of servers still admits something.
    """
    if app_servers == 1:
        return float(policy.limit), float(policy.period_ms), float(policy.capacity)
    if policy.algorithm in BURST_ALGORITHMS:
        return (float(policy.limit), float(policy.period_ms * app_servers),
                float(max(policy.capacity // app_servers, 1)))
    share = float(max(policy.limit // app_servers, 1))
    return share, float(policy.period_ms), share


class LocalLimiter:
    """Decides requests against policies in this process, with the semantics of the Lua engine.

    The API mirrors `RateLimiter`: `hit`, `peek`, `hit_many` (always all-or-nothing) and `reset`.
    `clock` returns microseconds since the epoch; `app_servers` divides every policy (see
    `local_share`); `max_keys` bounds the number of states kept and `max_units` the entries of all
    sliding-window logs together.
    """

    def __init__(self, *, app_servers: int = 1, clock: Clock = wall_clock_us,
                 max_keys: int = DEFAULT_MAX_KEYS, max_units: int = DEFAULT_MAX_UNITS) -> None:
        if isinstance(app_servers, bool) or not isinstance(app_servers, int) or app_servers < 1:
            raise ValueError(f"app_servers: {app_servers!r} must be an integer >= 1")
        for name, value in (("max_keys", max_keys), ("max_units", max_units)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: {value!r} must be an integer >= 1")
        self.app_servers = app_servers
        self.clock = clock
        self._store = _Store(max_keys, max_units)
        self._lock = threading.Lock()

    def hit(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Charge `cost` to every policy if all of them allow it; charge nothing otherwise."""
        return self.decide([(identity, policies)], cost, charge=True)[0]

    def peek(self, identity: str, policies: Sequence[Policy], cost: int = 1) -> Decision:
        """Report what `hit` would decide for `cost`, charging nothing."""
        return self.decide([(identity, policies)], cost, charge=False)[0]

    def hit_many(self, checks: Sequence[Check], cost: int = 1, *, lease: str | None = None) -> list[Decision]:
        """Decide several identities together, all-or-nothing across all of them (`lease`: the token
        concurrency slots are held under)."""
        return self.decide(checks, cost, charge=True, lease=lease)

    def release(self, held: Sequence[tuple[str, Policy]], lease: str) -> None:
        """Give back the concurrency slots held under `lease` (see RateLimiter.release)."""
        with self._lock:
            now_us = float(self.clock())
            for identity, policy in held:
                key = f"{identity_digest(identity)}:{policy.name}:{policy.algorithm}"
                leases = self._store.get(key, now_us)
                if leases and lease in leases:
                    kept = {token: expiry for token, expiry in leases.items() if token != lease and expiry > now_us}
                    if kept:
                        self._store.set(key, kept, (max(kept.values()) - now_us) / 1000, now_us, len(kept))
                    else:
                        self._store.delete(key)

    def reset(self, identity: str, policies: Sequence[Policy]) -> None:
        """Forget the state of `identity` for these policies."""
        digest = identity_digest(identity)
        with self._lock:
            for policy in policies:
                self._store.delete(f"{digest}:{policy.name}:{policy.algorithm}")

    def clear(self) -> None:
        """Forget every state (used when Redis is back: the next outage starts afresh)."""
        with self._lock:
            self._store.clear()

    def __len__(self) -> int:
        """The number of states held (at most max_keys)."""
        return len(self._store)

    def decide(self, checks: Sequence[Check], cost: int, *, charge: bool, lease: str | None = None) -> list[Decision]:
        """One all-or-nothing decision over every policy of every check (decide.lua); concurrency slots
        are taken under `lease`."""
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
                rows.append((policy, f"{digest}:{policy.name}:{policy.algorithm}", limit, period_ms, capacity))
            plan.append(rows)
        fcost = float(cost)
        with self._lock:
            now_us = float(self.clock())
            outcomes = [[MODELS[policy.algorithm](self._store, key, now_us, limit, period_ms, capacity, fcost,
                                                      *((lease,) if policy.algorithm == CONCURRENCY else ()))
                         for policy, key, limit, period_ms, capacity in rows] for rows in plan]
            all_allowed = all(outcome[0] or row[0].shadow for rows, per_check in zip(plan, outcomes, strict=True)
                              for row, outcome in zip(rows, per_check, strict=True))
            decisions = []
            for rows, per_check in zip(plan, outcomes, strict=True):
                results: list[PolicyResult] = []
                shadow: list[PolicyResult] = []
                for (policy, _, _, _, capacity), (allowed, remaining, reset_us, retry_us, apply) in zip(
                        rows, per_check, strict=True):
                    if charge and all_allowed and allowed and apply is not None:
                        reset_us = apply()
                        remaining = remaining - (1.0 if policy.algorithm == CONCURRENCY else fcost)
                    (shadow if policy.shadow else results).append(
                        _result(policy.name, allowed, capacity, remaining, reset_us, retry_us))
                decision = Decision.from_results(tuple(results), shadow=tuple(shadow))
                if decision.allowed and not all_allowed:
                    decision = decision.refused()
                decisions.append(decision)
        return decisions


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
