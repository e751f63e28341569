"""Concurrency slots taken for a gateway's request, handed to the gateway as one header value.

When a request's decision takes concurrency slots (a tier's concurrency limit, the load shedder's fleet
count), the endpoint's 200 carries `X-RateLimit-Lease`: the slots and the token they are held under,
signed with SECRET_KEY (django.core.signing), so that the service confirms the request with it (the
confirm endpoint: its slots held their full lease, after the first lease of the `authorize` contract)
and whoever sees the end of the request (nginx's post_action, or the service itself) gives them back
with one call to the release endpoint. A slot nobody gives back frees itself when its lease runs out
(the first lease, or the concurrency limit's period).

When the request reserved usage (`X-RateLimit-Usage`), the value carries that reservation too, so that
the release settles it at what the service reports (`usage_of`), once: the first release that reports
usage marks the lease settled in Redis (a key of its own, for as long as the reservation's longest
limit period), and a replayed release settles nothing more. A release that never comes leaves the
estimate charged. The value is there when the request took no slot as well.

The value names identity labels ("key:<prefix>", "ip:203.0.113.7"), never an API key; it is signed, not
encrypted, and meant for the gateway and the service, not for clients.
"""

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
