"""The Redis keys and hash fields of the decision metrics: what the recorder writes and the queries read.

What Redis holds (`<KEY_PREFIX>` is RATELIMIT['KEY_PREFIX']; every counter key lives METRICS_TTL_HOURS
hours after its last write, default 48):
- `<KEY_PREFIX>:{metrics}:h:<YYYYMMDDHH>` (UTC hour), a hash of counters: `allowed`, `blocked`,
  `unauthorized` (401s), `degraded`, `degraded_blocked`, `tier:<tier>:allowed`, `tier:<tier>:blocked`,
  `tier:<tier>:unauthorized`, `policy:<policy>:blocked`; for allow/deny lists `denied_by_list`,
  `allowed_by_list` and `tier:<tier>:<either>`; for shadow limits `shadow:<tier>:<policy>` (requests a
  shadow limit would have refused).
- `<KEY_PREFIX>:{metrics}:blocked:<YYYYMMDD>` (UTC day), a sorted set of blocked identity labels
  ("key:<prefix>" or "ip:<address>", never a full key) scored by blocked requests. It keeps the
  `max(50 x TOP_BLOCKED, 1000)` most blocked identities of the day; queries return TOP_BLOCKED.
- `<KEY_PREFIX>:{metrics}:shadow:<YYYYMMDD>` (UTC day), the same for identities a shadow limit would
  have blocked.
- `<KEY_PREFIX>:{metrics}:applied:<writer>`, the number of the last batch a process (a writer) applied:
  a copy of a batch sent again is not added twice (observability.pending). It lives twice
  METRICS_TTL_HOURS after its last write.

Every key shares the `{metrics}` hash tag, so one batch lands in one Redis Cluster slot.
"""

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
