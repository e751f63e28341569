"""Usage limits (a Policy with a `unit`, "tokens"): an estimate reserved by the decision that admits a
request (decide.lua: the policy's own cost), its real usage settled when it ends (lua/settle.lua: the
unused part given back, an overrun charged). A settlement that never comes leaves the estimate charged.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from .algorithms import BY_NAME, CALENDAR_WINDOW
from .decision import Decision
from .engine import Check, Usage
from .exceptions import REDIS_CLIENT_ERRORS, BackendError
from .keys import identity_digest, tag
from .policies import MAX_LIMIT, Policy
from .scripts import settle_sha, settle_source

_UNIT = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_SHIFT = struct.Struct(">q")
_POLICY = struct.Struct(">qqqqqqqB")  # code, limit, period, extra, estimate, used, age in us, tag length
#: Added to the age of a reservation sent to lua/settle.lua (us): the time the settling call may take to
#: reach Redis, so that "reserved at or after now - age" holds there (see settle.lua).
AGE_MARGIN_US = 100_000


def usage_pairs(usage: Mapping[str, int]) -> Usage:
    """The (unit, estimate) pairs of `usage`, sorted; ValueError for a unit or an estimate that is not one."""
    if not isinstance(usage, Mapping):
        raise TypeError(f"usage: expected a mapping of unit to estimate, got {type(usage).__name__}")
    for unit, estimate in usage.items():
        if not isinstance(unit, str) or not _UNIT.match(unit):
            raise ValueError(f"usage: {unit!r:.40} is not a unit such as 'tokens'")
        if type(estimate) is not int or not 1 <= estimate <= MAX_LIMIT:
            raise ValueError(f"usage: the estimate of {unit} ({estimate!r:.40}) must be an integer from 1 to "
                             f"{MAX_LIMIT}")
    return tuple(sorted(usage.items()))


def charged(policies: Sequence[Policy], usage: Usage) -> tuple[Policy, ...]:
    """`policies` but the usage limits of a unit `usage` has no estimate of (a request is charged only what
    it reserves)."""
    units = {unit for unit, _ in usage}
    return tuple(policy for policy in policies if not policy.unit or policy.unit in units)


@dataclass(frozen=True)
class Reservation:
    """What an admitted request reserved: for each identity, its usage limits charged an estimate of
    their unit (`estimates`); `started`, time.monotonic() before the decision was sent; `shift`, the
    decision's clock shift (tests). Empty when the request was refused."""

    prefix: str = ""
    held: tuple[tuple[str, tuple[Policy, ...]], ...] = ()
    estimates: Usage = ()
    started: float = 0.0
    shift: int = 0

    def estimate(self, unit: str) -> int:
        """The units of `unit` reserved (0 when none)."""
        return dict(self.estimates).get(unit, 0)

    @property
    def units(self) -> tuple[str, ...]:
        """The units this reservation holds an estimate of, each limited by a policy."""
        held = {policy.unit for _, policies in self.held for policy in policies}
        return tuple(unit for unit, _ in self.estimates if unit in held)


#: A request that reserved nothing.
NO_RESERVATION = Reservation()


def reservation(prefix: str, checks: Sequence[Check], usage: Usage, started: float, shift: int,
                decisions: Sequence[Decision]) -> Reservation:
    """The reservation a decision over `checks` made with `usage`: nothing unless every check allowed."""
    if not usage or len(decisions) != len(checks) or not all(d.allowed for d in decisions):
        return NO_RESERVATION
    units = {unit for unit, _ in usage}
    held = tuple((identity, tuple(p for p in policies if p.unit in units and not p.shadow))
                 for identity, policies in checks)
    held = tuple((identity, policies) for identity, policies in held if policies)
    return Reservation(prefix, held, usage, started, shift) if held else NO_RESERVATION


def _code(policy: Policy) -> tuple[int, int, int]:
    """The code, period and extra number of `policy`, as the scripts read them."""
    if policy.calendar:
        return CALENDAR_WINDOW.code, policy.calendar_rule, policy.clock_shift_ms
    algorithm = BY_NAME[policy.algorithm]
    return algorithm.code, policy.period_ms, policy.capacity if algorithm.takes_burst else 0


def settle_calls(reservation: Reservation, used: Mapping[str, int],
                 now: float | None = None) -> list[tuple[list[str], bytes]]:
    """The KEYS and ARGV[1] of lua/settle.lua for each identity of `reservation`, settling each unit at
    `used[unit]` (a unit missing from it stays charged at its estimate); ValueError for a bad count."""
    for unit, count in used.items():
        if type(count) is not int or not 0 <= count <= MAX_LIMIT:
            raise ValueError(f"used: {unit}={count!r:.40} must be an integer from 0 to {MAX_LIMIT}")
    age_us = int(((time.monotonic() if now is None else now) - reservation.started) * 1_000_000) + AGE_MARGIN_US
    estimates = dict(reservation.estimates)
    calls = []
    for identity, policies in reservation.held:
        base = f"{reservation.prefix}:{{{identity_digest(identity)}}}"
        keys, numbers = [base], [_SHIFT.pack(reservation.shift)]
        for policy in policies:
            if policy.unit not in used:
                continue
            name = tag(policy)
            code, period, extra = _code(policy)
            keys.append(base + name)
            numbers.append(_POLICY.pack(code, policy.limit, period, extra, estimates[policy.unit],
                                        used[policy.unit], age_us, len(name)) + name.encode())
        if len(keys) > 1:
            calls.append((keys, b"".join(numbers)))
    return calls


def settle(client: Any, reservation: Reservation, used: Mapping[str, int]) -> int:
    """Settle `reservation` at `used` through a redis-py client (one EVALSHA per identity; the script
    loaded on NOSCRIPT); how many policies changed. Raises BackendError when Redis cannot be asked."""
    changed = 0
    try:
        for keys, numbers in settle_calls(reservation, used):
            try:
                changed += int(client.evalsha(settle_sha(), len(keys), *keys, numbers))
            except NoScriptError:
                changed += int(client.eval(settle_source(), len(keys), *keys, numbers))
    except REDIS_CLIENT_ERRORS as exc:
        raise BackendError(f"could not settle usage: {exc}", maybe_applied=True) from exc
    return changed


async def asettle(client: Any, reservation: Reservation, used: Mapping[str, int]) -> int:
    """`settle` through a redis.asyncio client."""
    changed = 0
    try:
        for keys, numbers in settle_calls(reservation, used):
            try:
                changed += int(await client.evalsha(settle_sha(), len(keys), *keys, numbers))
            except NoScriptError:
                changed += int(await client.eval(settle_source(), len(keys), *keys, numbers))
    except REDIS_CLIENT_ERRORS as exc:
        raise BackendError(f"could not settle usage: {exc}", maybe_applied=True) from exc
    return changed
