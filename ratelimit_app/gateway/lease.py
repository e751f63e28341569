"""`X-RateLimit-Lease`: the concurrency slots a gateway's request took and the usage it reserved, as one
value signed with SECRET_KEY, for the confirm and release calls (docs/gateway.md, "Concurrency slots",
"Usage limits"). It names identity labels, never an API key; signed, not encrypted: not for clients."""

from __future__ import annotations

import secrets
import time
from typing import Any, NamedTuple

from django.core import signing

from ..apply.concurrency import HeldSlots
from ..core.policies import CONCURRENCY, InvalidPolicy, Policy
from ..core.usage import Reservation

LEASE_HEADER = "X-RateLimit-Lease"
_SALT = "ratelimit_app.gateway.lease"
#: The longest value accepted (a request holds a few slots: its tier's, its key's own, the fleet's).
MAX_LEASE = 4096


class CarriedUsage(NamedTuple):
    """The usage reservation a lease carries, the Redis key that marks it settled (set once, by the
    first release that settles it: `SET NX`), and how long that mark lasts (ms: the reservation's
    longest limit period, after which a settlement changes nothing)."""

    reservation: Reservation
    marker: str
    marker_ms: int


class BadLease(ValueError):
    """A lease value that this site did not sign, or that holds no slots (answered 400)."""


def lease_value(slots: HeldSlots | None, reservation: Reservation | None = None) -> str:
    """`slots` (and the usage `reservation`) as one signed, header-safe value (URL-safe base64 and ':')."""
    held = [[identity, policy.name, policy.limit, policy.period] for identity, policy in slots.held] if slots else []
    payload: dict[str, Any] = {"t": slots.token if slots else "", "l": bool(slots and slots.local), "h": held}
    if reservation is not None and reservation.held:
        # started: a time.monotonic() of this process, sent as wall-clock time for the process that settles
        wall = time.time() - (time.monotonic() - reservation.started)
        payload["u"] = [reservation.prefix, [[identity, [_policy_fields(p) for p in policies]]
                                             for identity, policies in reservation.held],
                        [list(pair) for pair in reservation.estimates], wall, reservation.shift,
                        secrets.token_hex(12)]
    return signing.dumps(payload, salt=_SALT, compress=True)


def _policy_fields(policy: Policy) -> list[Any]:
    return [policy.name, policy.algorithm, policy.limit, policy.period, policy.burst, policy.calendar,
            policy.time_zone, policy.clock_shift_ms, policy.unit]


def usage_of(value: str) -> CarriedUsage | None:
    """The usage reservation a lease value carries (None: none). Raises BadLease."""
    payload = _payload(value)
    if "u" not in payload:
        return None
    try:
        prefix, held, estimates, wall, shift, nonce = payload["u"]
        policies = tuple((str(identity), tuple(Policy(name, algorithm, limit=limit, period=period, burst=burst,
                                                      calendar=calendar, time_zone=zone, clock_shift_ms=clock,
                                                      unit=unit)
                                               for name, algorithm, limit, period, burst, calendar, zone, clock, unit
                                               in fields))
                         for identity, fields in held)
        started = time.monotonic() - (time.time() - float(wall))
        reservation = Reservation(str(prefix), policies, tuple((str(u), int(n)) for u, n in estimates), started,
                                  int(shift))
        longest = max(policy.period for _, limits in policies for policy in limits)
        return CarriedUsage(reservation, f"{prefix}:settled:{str(nonce)[:32]}", max(int(longest * 1000), 1000))
    except (InvalidPolicy, KeyError, TypeError, ValueError):
        raise BadLease(f"{LEASE_HEADER} is signed but does not name a reservation") from None


def _payload(value: str) -> Any:
    if len(value) > MAX_LEASE:
        raise BadLease(f"{LEASE_HEADER} is longer than {MAX_LEASE} characters")
    try:
        return signing.loads(value, salt=_SALT)
    except signing.BadSignature:
        raise BadLease(f"{LEASE_HEADER} was not signed by this site (SECRET_KEY)") from None


def slots_of(value: str) -> HeldSlots:
    """The slots a lease value names, to be given back (`HeldSlots.release`; none held: nothing to give
    back). Raises BadLease."""
    payload = _payload(value)
    try:
        held = tuple((str(identity), Policy(str(name), CONCURRENCY, limit=limit, period=period))
                     for identity, name, limit, period in payload["h"])
        return HeldSlots(str(payload["t"]), held, bool(payload["l"]))
    except (InvalidPolicy, KeyError, TypeError, ValueError):
        raise BadLease(f"{LEASE_HEADER} is signed but does not name slots") from None
