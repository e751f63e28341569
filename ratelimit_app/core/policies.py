"""Policies: what one limit allows, and the rate strings that describe it ("20/m", "5/10m")."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from .algorithms import BY_NAME, REGISTRY
from .calendars import CALENDAR_PERIODS, CALENDARS, is_valid_time_zone, rule_at

#: The rate algorithms: requests over time (ratelimit_app.core.algorithms has them all).
ALGORITHMS: tuple[str, ...] = tuple(a.name for a in REGISTRY if not a.concurrency)
#: Requests in flight (slots, each a lease of `period` seconds) rather than requests over time: a policy
#: of its own kind, apart from the rate ALGORITHMS (a request takes one slot whatever its cost, and gives
#: it back when its response is finished; see docs/protection.md).
CONCURRENCY: str = next(a.name for a in REGISTRY if a.concurrency)
#: Every algorithm a Policy may use.
ALL_ALGORITHMS: tuple[str, ...] = tuple(a.name for a in REGISTRY)
#: Algorithms whose capacity (burst) may differ from the limit.
BURST_ALGORITHMS = frozenset(a.name for a in REGISTRY if a.takes_burst)

#: Milliseconds per period unit. "ms" exists so that every Policy prints as a rate that parses back.
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: Spellings of the units, DRF's included ("100/hr", "10/mins", "5/secs").
_UNIT_WORDS = {
    "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "min": "m", "mins": "m", "minute": "m", "minutes": "m",
    "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "day": "d", "days": "d",
}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
#: A unit of usage ("tokens"): lowercase letters, digits and '_', starting with a letter.
_UNIT = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

# Lua numbers are doubles: integers stay exact up to 2**53, and every algorithm's state must stay below.
_MAX_EXACT = 2**53
MAX_LIMIT = 10**9
MAX_PERIOD_SECONDS = 366 * 86400


class InvalidPolicy(ValueError):
    """A policy or rate string that cannot be enforced; the message names the field at fault."""


def _parse_period(text: str) -> int | float:
    """Return the seconds in a period such as "m", "10m", "1h", "30s", "day", "500ms" (an int when whole)."""
    match = re.fullmatch(r"\s*(\d*)\s*([a-z]+)\s*", text.lower())
    if not match:
        raise InvalidPolicy(f"period: {text!r} is not a period such as '30s', '10m', '1h' or '1d'")
    multiplier = int(match.group(1) or 1)
    unit = _UNIT_WORDS.get(match.group(2), match.group(2))
    if unit not in _UNIT_MS:
        raise InvalidPolicy(f"period: unknown unit {match.group(2)!r} (use ms, s, m, h or d)")
    if multiplier < 1:
        raise InvalidPolicy(f"period: multiplier in {text!r} must be at least 1")
    milliseconds = multiplier * _UNIT_MS[unit]
    return milliseconds // 1000 if milliseconds % 1000 == 0 else milliseconds / 1000


def parse_rate(rate: str) -> tuple[int, int | float]:
    """Parse "LIMIT/[N]UNIT" into (limit, period in seconds): "5/10m" -> (5, 600), "100/hr" -> (100, 3600).

    Units: ms, s, m, h, d, and the words sec(s), second(s), min(s), minute(s), hr(s), hour(s), day(s).
    The limit may be 0 here; a Policy needs at least 1 (a zero rate is for callers that deny everything).
    """
    if not isinstance(rate, str):
        raise InvalidPolicy(f"rate: expected a string such as '20/m', got {type(rate).__name__}")
    match = _RATE.match(rate.lower())
    if not match:
        raise InvalidPolicy(f"rate: {rate!r} is not a rate such as '20/m', '5/10m' or '1000/d'")
    limit = int(match.group(1))
    period = _parse_period(f"{match.group(2)}{match.group(3)}")
    return limit, period


@dataclass(frozen=True)
class Policy:
    """One named limit: `limit` units per `period` seconds under `algorithm`.

    For token_bucket and gcra, limit/period is the sustained rate and `burst` the capacity
    (default: `limit`). Other algorithms take no burst. A `shadow` policy (a dry run) is counted like
    any other but never refuses: its would-be refusals are reported apart (`Decision.shadow`).
    A `calendar` policy ("day", "week" or "month"; fixed_window only, its period the calendar's longest,
    `CALENDAR_PERIODS`) counts per calendar period in `time_zone` (see ratelimit_app.core.calendars);
    `clock_shift_ms` moves the Redis time such a policy is decided at, for tests only (0 in production).
    A policy with a `unit` ("tokens"; blank: requests) is a usage limit: it counts units of usage, is
    charged only by a reservation (`RateLimiter.reserve`, settled later) and never by a plain request.
    Invalid values raise InvalidPolicy.
    """

    name: str
    algorithm: str
    limit: int
    period: float
    burst: int | None = None
    shadow: bool = False
    calendar: str = ""
    time_zone: str = "UTC"
    clock_shift_ms: int = 0
    unit: str = ""
    period_ms: int = field(init=False, repr=False, compare=False)
    #: the calendar rule sent to the script (0 for other policies); part of equality, so a new rule
    #: (after a DST change) is a new policy set for the engine's caches
    calendar_rule: int = field(init=False, repr=False, compare=True, default=0)
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidPolicy(
                f"name: {self.name!r} must be 1-64 characters of letters, digits, '_', '-' or '.'"
            )
        if self.algorithm not in ALL_ALGORITHMS:
            raise InvalidPolicy(
                f"algorithm: {self.algorithm!r} for policy {self.name!r} is not one of "
                f"{', '.join(ALL_ALGORITHMS)}"
            )
        self._check_count("limit", self.limit)
        if isinstance(self.period, bool) or not isinstance(self.period, (int, float)):
            raise InvalidPolicy(f"period: {self.period!r} for policy {self.name!r} must be a number of seconds")
        period_ms = round(self.period * 1000)
        if not 1 <= period_ms <= MAX_PERIOD_SECONDS * 1000:
            raise InvalidPolicy(
                f"period: {self.period!r} for policy {self.name!r} must be between 0.001 and "
                f"{MAX_PERIOD_SECONDS} seconds"
            )
        object.__setattr__(self, "period_ms", period_ms)
        if not isinstance(self.shadow, bool):
            raise InvalidPolicy(f"shadow: {self.shadow!r} for policy {self.name!r} must be True or False")
        if self.calendar:
            self._check_calendar()
        if self.unit:
            self._check_unit()
        # hashed on every decision (the engine caches its packed commands by policy set), so once here
        object.__setattr__(self, "_hash", hash((self.name, self.algorithm, self.limit, self.period, self.burst,
                                                self.shadow, self.calendar_rule, self.clock_shift_ms, self.unit)))
        if self.burst is not None:
            if self.algorithm not in BURST_ALGORITHMS:
                raise InvalidPolicy(
                    f"burst: policy {self.name!r} uses {self.algorithm}, which has no burst "
                    f"(only {' and '.join(sorted(BURST_ALGORITHMS))} do)"
                )
            self._check_count("burst", self.burst)
        if BY_NAME[self.algorithm].largest_state(self.capacity, self.limit, self.period_ms) >= _MAX_EXACT:
            field_name = "burst" if self.burst is not None else "limit"
            raise InvalidPolicy(
                f"{field_name}: policy {self.name!r} allows {self.capacity} units over {self.period}s, too "
                "large to count exactly in Redis; use a shorter period or a smaller burst"
            )

    def _check_count(self, field_name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
            raise InvalidPolicy(f"{field_name}: {value!r} for policy {self.name!r} must be an integer from 1 to "
                                f"{MAX_LIMIT}")

    def _check_calendar(self) -> None:
        if self.calendar not in CALENDARS:
            raise InvalidPolicy(f"calendar: {self.calendar!r} for policy {self.name!r} is not one of "
                                f"'', {', '.join(CALENDARS)}")
        if self.algorithm != "fixed_window":
            raise InvalidPolicy(f"algorithm: a calendar quota counts per calendar {self.calendar}: use "
                                f"fixed_window, not {self.algorithm}")
        if self.period != CALENDAR_PERIODS[self.calendar]:
            raise InvalidPolicy(f"period: a calendar {self.calendar} quota has period "
                                f"{CALENDAR_PERIODS[self.calendar]} (its longest length), not {self.period}")
        if not is_valid_time_zone(self.time_zone):
            raise InvalidPolicy(f"time_zone: {self.time_zone!r} for policy {self.name!r} is not a known time zone")
        if isinstance(self.clock_shift_ms, bool) or not isinstance(self.clock_shift_ms, int):
            raise InvalidPolicy(f"clock_shift_ms: {self.clock_shift_ms!r} must be an integer")
        # the app clock only picks which DST change is "next" (see ratelimit_app.core.calendars)
        rule = rule_at(self.calendar, self.time_zone, time.time() + self.clock_shift_ms / 1000)
        object.__setattr__(self, "calendar_rule", rule)

    def _check_unit(self) -> None:
        if not isinstance(self.unit, str) or not _UNIT.match(self.unit) or self.unit == "requests":
            raise InvalidPolicy(f"unit: {self.unit!r:.40} for policy {self.name!r} must be a unit of usage such as "
                                "'tokens' (1-32 lowercase letters, digits or '_'), or blank for requests")
        if self.algorithm == CONCURRENCY:
            raise InvalidPolicy(f"unit: policy {self.name!r} counts requests in flight, which have no unit")

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt, not copied: the cached hash of another process (string hashes are salted) is wrong here
        return (Policy, (self.name, self.algorithm, self.limit, self.period, self.burst, self.shadow,
                         self.calendar, self.time_zone, self.clock_shift_ms, self.unit))

    @property
    def capacity(self) -> int:
        """The most units one request can ever be granted: the burst, or the limit."""
        return self.burst if self.burst is not None else self.limit

    @property
    def state_ttl(self) -> float:
        """The longest time, in seconds, that this policy's Redis state lives after a hit."""
        if self.algorithm in BURST_ALGORITHMS:
            return self.capacity * self.period / self.limit
        if self.algorithm == "sliding_window_counter":
            return 2 * self.period
        return float(self.period)

    @classmethod
    def parse(cls, rate: str, *, name: str, algorithm: str = "sliding_window", burst: int | None = None) -> Policy:
        """Build a policy from a rate string: Policy.parse("5/10m", name="burst", algorithm="gcra")."""
        limit, period = parse_rate(rate)
        return cls(name, algorithm, limit=limit, period=period, burst=burst)

    @property
    def rate(self) -> str:
        """The policy as a rate string that `parse_rate` reads back: "20/m", "5/10m", "5000/30d", "3/500ms"."""
        for unit in ("d", "h", "m", "s", "ms"):
            count, rest = divmod(self.period_ms, _UNIT_MS[unit])
            if rest == 0:
                return f"{self.limit}/{unit}" if count == 1 else f"{self.limit}/{count}{unit}"
        raise AssertionError("unreachable: every period is a whole number of milliseconds")
