"""Concurrency slots taken for a gateway's request, handed to the gateway as one header value.

When a request's decision takes concurrency slots (a tier's concurrency limit, the load shedder's fleet
count), the endpoint's 200 carries `X-RateLimit-Lease`: the slots and the token they are held under,
signed with SECRET_KEY (django.core.signing), so that the service confirms the request with it (the
confirm endpoint: its slots held their full lease, after the first lease of the `authorize` contract)
and whoever sees the end of the request (nginx's post_action, or the service itself) gives them back
with one call to the release endpoint. A slot nobody gives back frees itself when its lease runs out
(the first lease, or the concurrency limit's period).

The value names identity labels ("key:<prefix>", "ip:203.0.113.7"), never an API key; it is signed, not
encrypted, and meant for the gateway and the service, not for clients.
"""

from __future__ import annotations

from typing import Any

from django.core import signing

from ..apply.concurrency import HeldSlots
from ..core.policies import CONCURRENCY, InvalidPolicy, Policy

LEASE_HEADER = "X-RateLimit-Lease"
_SALT = "ratelimit_app.gateway.lease"
#: The longest value accepted (a request holds a few slots: its tier's, its key's own, the fleet's).
MAX_LEASE = 4096


class BadLease(ValueError):
    """A lease value that this site did not sign, or that holds no slots (answered 400)."""


def lease_value(slots: HeldSlots) -> str:
    """`slots` as one signed, header-safe value (URL-safe base64 and ':')."""
    held = [[identity, policy.name, policy.limit, policy.period] for identity, policy in slots.held]
    return signing.dumps({"t": slots.token, "l": slots.local, "h": held}, salt=_SALT, compress=True)


def slots_of(value: str) -> HeldSlots:
    """The slots a lease value names, to be given back (`HeldSlots.release`). Raises BadLease."""
    if len(value) > MAX_LEASE:
        raise BadLease(f"{LEASE_HEADER} is longer than {MAX_LEASE} characters")
    try:
        payload: Any = signing.loads(value, salt=_SALT)
        held = tuple((str(identity), Policy(str(name), CONCURRENCY, limit=limit, period=period))
                     for identity, name, limit, period in payload["h"])
        return HeldSlots(str(payload["t"]), held, bool(payload["l"]))
    except signing.BadSignature:
        raise BadLease(f"{LEASE_HEADER} was not signed by this site (SECRET_KEY)") from None
    except (InvalidPolicy, KeyError, TypeError, ValueError):
        raise BadLease(f"{LEASE_HEADER} is signed but does not name slots") from None
