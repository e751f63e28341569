"""The algorithms of ratelimit_app/core/lua in Python, one model per algorithm (`MODELS`), with the same state,
arithmetic (in floats, as Lua numbers are doubles) and results as the Lua function of the same name.
A model returns an `Outcome`; its `apply` charges the request and returns the new reset."""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right, insort
from collections import OrderedDict
from collections.abc import Callable
from datetime import date
from typing import Any

# allowed, remaining now, reset now (us), retry (us; 0 allowed, -1 never), apply (commit -> reset us)
Outcome = tuple[bool, float, float, float, Callable[[], float] | None]


class Store:
    """Key -> state with a TTL (like the Redis keys the scripts write), bounded, least recently written out:
    at most `max_keys` states and a total weight of `max_units` (a state weighs 1, a sliding-window log its
    number of entries), always at least the newest state."""

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


def fixed_window(store: Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
                 cost: float) -> Outcome:
    """ratelimit_app/core/lua/fixed_window.lua."""
    period_us = period_ms * 1000
    window = math.floor(now_us / period_us)
    reset_us = (window + 1) * period_us - now_us
    return _count_in_window(store, key, now_us, window, reset_us, limit, cost)


def _count_in_window(store: Store, key: str, now_us: float, window: int, reset_us: float, limit: float,
                    cost: float) -> Outcome:
    """The decision of a counter per window (fixed_window, calendar_window): the prelude's
    _count_in_window. The state is (the window's index, units used); another window's count is none."""
    stored = store.get(key, now_us)
    used: float = stored[1] if stored is not None and stored[0] == window else 0
    remaining = max(limit - used, 0)
    if cost > limit:
        return False, remaining, reset_us, -1, None
    if used + cost > limit:
        return False, remaining, reset_us, reset_us, None

    def apply() -> float:
        store.set(key, (window, used + cost), math.ceil(reset_us / 1000), now_us)
        return reset_us

    return True, remaining, reset_us, 0, apply


def sliding_window(store: Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
                   cost: float) -> Outcome:
    """ratelimit_app/core/lua/sliding_window.lua (its log of 7-byte admission times is a sorted array here)."""
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


def sliding_window_counter(store: Store, key: str, now_us: float, limit: float, period_ms: float,
                           capacity: float, cost: float) -> Outcome:
    """ratelimit_app/core/lua/sliding_window_counter.lua."""
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


def token_bucket(store: Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
                 cost: float) -> Outcome:
    """ratelimit_app/core/lua/token_bucket.lua (the string "<units>:<stamp>" is a tuple here)."""
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


def gcra(store: Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
         cost: float) -> Outcome:
    """ratelimit_app/core/lua/gcra.lua."""
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


def concurrency(store: Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
                cost: float, lease: str | None = None) -> Outcome:
    """ratelimit_app/core/lua/concurrency.lua (the sorted set is a dict of lease token -> expiry in us)."""
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


# -- calendar quotas (ratelimit_app/core/lua/calendar_window.lua; ratelimit_app.core.calendars has the rule) --
_RULE_UNIT = 2**27  # the calendar rule: ((unit * 128 + offset_now) * 128 + offset_next) * 2**27 + change_minute
_EPOCH_DAY = date(1970, 1, 1).toordinal()


def _calendar_period(rule: int, now_s: int) -> tuple[int, int]:
    """(the period's index, the Unix second the next period starts) of a calendar rule at `now_s`: the
    local day number, Monday's day number or year * 12 + month - 1, as calendar_window.lua counts them."""
    change_s = rule % _RULE_UNIT * 60
    rest = rule // _RULE_UNIT
    offset_next, offset_now, unit = (rest % 128 - 64) * 900, (rest // 128 % 128 - 64) * 900, rest // 16384
    day = (now_s + (offset_next if now_s >= change_s else offset_now)) // 86400
    if unit == 1:
        window, next_day = day, day + 1
    elif unit == 2:
        window = day - (day + 3) % 7  # 1970-01-01 was a Thursday
        next_day = window + 7
    else:
        civil = date.fromordinal(day + _EPOCH_DAY)  # (the script computes the date by hand)
        y, m = civil.year, civil.month
        window, next_day = y * 12 + m - 1, date(y + (m == 12), m % 12 + 1, 1).toordinal() - _EPOCH_DAY
    next_s = next_day * 86400 - offset_now
    return window, next_s if next_s < change_s else next_day * 86400 - offset_next


def calendar_window(store: Store, key: str, now_us: float, limit: float, period_ms: float, capacity: float,
                    cost: float) -> Outcome:
    """ratelimit_app/core/lua/calendar_window.lua: `period_ms` is the calendar rule and `capacity` the
    policy's own clock shift in ms, as the script gets them (the state: the period's index, units used)."""
    local_us = now_us + capacity * 1000
    window, next_s = _calendar_period(int(period_ms), math.floor(local_us / 1_000_000))
    reset_us = max(next_s * 1_000_000 - local_us, 1000)
    return _count_in_window(store, key, now_us, window % 65536, reset_us, limit, cost)


#: The model of each algorithm, by name (tests/core/test_scripts.py checks that every algorithm of
#: ratelimit_app.core.algorithms has one).
MODELS: dict[str, Callable[..., Outcome]] = {model.__name__: model for model in (
    fixed_window, sliding_window, sliding_window_counter, token_bucket, gcra, concurrency, calendar_window)}
