"""Decision metrics (allowed / blocked / degraded per hour, per tier and policy, top blocked identities).

Request-handling code calls `record_decision` once per limited request. It must stay cheap: it only
counts in process; counts reach Redis in batches.
"""

from __future__ import annotations


def record_decision(*, allowed: bool, tier: str, policy: str | None, degraded: bool, identity: str) -> None:
    """Count one limited request.

    `tier` is the tier slug ("free", or "ip" for the per-IP limit alone); `policy` the name of the policy
    that denied (None when allowed); `degraded` whether Redis was bypassed; `identity` a display label
    such as "key:<prefix>" or "ip:203.0.113.7" -- never a full API key.
    """
