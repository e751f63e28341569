"""`LimitCheck`: one identity's policies in a request's decision, and who asked for them (the request's own
limits, a view's, the load shedder, a DRF throttle, `@ratelimit`)."""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from ..core.policies import Policy

#: `LimitCheck.owner` of the request's own limits (per-IP and tier).
REQUEST_LIMITS = ""


class LimitCheck(NamedTuple):
    """One identity's policies in a request's decision. `owner`: REQUEST_LIMITS, or the label of the
    throttle or decorator that added the check (`LimitOutcome.decision_for` finds its result). `label`: what
    operators read for the identity when a throttle leads the decision, set by that throttle."""

    identity: str
    policies: tuple[Policy, ...]
    owner: str = REQUEST_LIMITS
    label: str = ""


def identity_digest(identity: str) -> str:
    """A short digest of an identity that may hold user data (an e-mail address in a throttle's cache key,
    a header's value): 12 hex digits, the same for the same identity, never the identity itself."""
    return hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
