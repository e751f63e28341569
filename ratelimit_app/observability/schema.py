"""The Redis keys and hash fields of the decision metrics, which the recorder writes and the queries read
(docs/observability.md lists them). Every key shares the `{metrics}` hash tag: one batch, one cluster slot."""

from __future__ import annotations

import time

HOUR = 3600
_DAY = 24 * HOUR


def top_candidates(top_blocked: int) -> int:
    """How many identities a day's top-blocked set keeps so that its top `top_blocked` are exact."""
    return max(50 * top_blocked, 1000)


def hour_key(prefix: str, hour: int) -> str:
    """Redis key of the counters of `hour` (hours since the epoch, UTC)."""
    return f"{prefix}:{{metrics}}:h:{time.strftime('%Y%m%d%H', time.gmtime(hour * HOUR))}"


def day_key(prefix: str, day: int) -> str:
    """Redis key of the top-blocked set of `day` (days since the epoch, UTC)."""
    return f"{prefix}:{{metrics}}:blocked:{time.strftime('%Y%m%d', time.gmtime(day * _DAY))}"


def shadow_day_key(prefix: str, day: int) -> str:
    """Redis key of the identities shadow limits would have blocked on `day` (days since the epoch, UTC)."""
    return f"{prefix}:{{metrics}}:shadow:{time.strftime('%Y%m%d', time.gmtime(day * _DAY))}"


def applied_key(prefix: str, writer: str) -> str:
    """Redis key of the number of the last batch `writer` (one process) applied."""
    return f"{prefix}:{{metrics}}:applied:{writer}"


def decision_fields(tier: str, policy: str, outcome: str, degraded: bool) -> list[str]:
    """The fields of an hour's hash that one decision adds 1 to."""
    fields = [outcome, f"tier:{tier}:{outcome}"]
    if outcome == "blocked":
        fields.append(f"policy:{policy}:blocked")
    if degraded:
        fields.append("degraded")
        if outcome == "blocked":
            fields.append("degraded_blocked")
    return fields


def shadow_field(tier: str, policy: str) -> str:
    """The field of an hour's hash that counts the requests shadow `policy` of `tier` would have refused."""
    return f"shadow:{tier}:{policy}"


def usage_field(tier: str, policy: str, unit: str) -> str:
    """The field of an hour's hash that counts the units of `unit` used under usage limit `policy` of `tier`."""
    return f"usage:{tier}:{policy}:{unit}"
