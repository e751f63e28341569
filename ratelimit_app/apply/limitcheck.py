"""`LimitCheck`: one identity's policies in a request's decision, and who asked for them.

Request handling (ratelimit_app.apply.limiting) decides every check of a request in one call; the views'
own limits (ratelimit_app.apply.routes), the load shedder (ratelimit_app.apply.shedding), the DRF throttles and
`@ratelimit` each add theirs.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from ..core.policies import Policy

#: `LimitCheck.owner` of the request's own limits (per-IP and tier).
REQUEST_LIMITS = ""


class LimitCheck(NamedTuple):
    """One identity's policies in a request's decision, and who asked for them.

    `owner` is REQUEST_LIMITS for the per-IP limit and the tier, else the label of the throttle or
    decorator that added the check (it finds its own result with `LimitOutcome.decision_for`). `label`
    is what operators read for the identity when a throttle leads the decision (the dashboard,
    ratelimit_metrics, the denial log): set by the throttle, which knows what its identity is.
    """

    identity: str
    policies: tuple[Policy, ...]
    owner: str = REQUEST_LIMITS
    label: str = ""


def identity_digest(identity: str) -> str:
    """A short digest of an identity that may hold user data (an e-mail address in a throttle's cache key,
    a header's value): 12 hex digits, the same for the same identity, never the identity itself."""
    return hashlib.blake2b(identity.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
