"""Rate limit response headers: legacy `X-RateLimit-*` and the IETF draft `RateLimit-Policy` / `RateLimit`.

RATELIMIT['HEADERS'] chooses "legacy", "ietf" or "both" (default). For one request:

    X-RateLimit-Limit: 10          capacity of the policy that matters most (see Decision)
    X-RateLimit-Remaining: 9       units left in it
    X-RateLimit-Reset: 3           seconds until it is back to its full allowance (delta, not a timestamp)
    X-RateLimit-Tier: free         the tier that applied (absent when none did)
    RateLimit-Policy: "ip";q=100;w=60, "burst";q=10;w=30, "minute";q=20;w=60, "day";q=1000;w=86400
    RateLimit: "ip";r=99;t=118, "burst";r=9;t=3, "minute";r=19;t=60, "day";r=999;t=38698

(a client's first request at 13:15:02 UTC; docs/usage.md shows one checked against a real response)

The IETF fields follow the revision of draft-ietf-httpapi-ratelimit-headers that RATELIMIT['HEADER_DRAFT']
names (only "draft-11" today; a later draft becomes a new entry of IETF_DRAFTS, chosen by that setting,
so a project moves when it chooses to): Structured Field lists whose
members are policy names (sf-strings) with parameters q (quota), w (window, seconds), r (remaining) and
t (seconds until the quota resets). For token_bucket and gcra, q is the burst and w the time the burst
takes to refill at the sustained rate, so q/w is the sustained rate. A concurrency policy is
`"concurrency";q=2;qu="concurrent-requests"` (q slots, no window); in `RateLimit` its r is the free
slots and t the time until the last lease held runs out (an upper bound: slots are usually given back
sooner). A usage limit carries its unit: `"llm.tokens";q=2000;w=60;qu="tokens"`. The legacy trio of an
allowed request describes the rate limits, not the slots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from django.http import HttpResponseBase

from ..conf.snapshot import request_settings
from ..core.decision import Decision, PolicyResult
from ..core.policies import BURST_ALGORITHMS, CONCURRENCY, Policy
from .concurrency import needs_lease

LEGACY = "legacy"
IETF = "ietf"


def _seconds(value: float) -> int:
    """Whole seconds, rounded up (a client that waits this long is never early)."""
    if value <= 0:
        return 0
    if math.isinf(value):
        return 0
    return math.ceil(value)


def window_seconds(policy: Policy) -> int:
    """The `w` of a policy: its period, or for token_bucket/gcra the time its burst takes to refill."""
    if policy.algorithm in BURST_ALGORITHMS:
        return max(1, math.ceil(policy.capacity * policy.period / policy.limit))
    return max(1, math.ceil(policy.period))


@lru_cache(maxsize=1024)
def _sf_string(name: str) -> str:
    # Policy names are limited to [A-Za-z0-9_.-] by Policy itself; escaping keeps this safe regardless.
    # Cached: the same few names are quoted for every response.
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


@lru_cache(maxsize=1024)
def policy_field(policies: tuple[Policy, ...]) -> str:
    """The `RateLimit-Policy` value for a set of policies (computed once per distinct set)."""
    return ", ".join(f'{_sf_string(p.name)};q={p.capacity};qu="concurrent-requests"' if p.algorithm == CONCURRENCY
                     else f"{_sf_string(p.name)};q={p.capacity};w={window_seconds(p)}" +
                     (f";qu={_sf_string(p.unit)}" if p.unit else "") for p in policies)


def ratelimit_field(results: Sequence[PolicyResult]) -> str:
    """The `RateLimit` value: remaining units and seconds to reset, per policy."""
    return ", ".join(f"{_sf_string(r.policy)};r={r.remaining};t={_seconds(r.reset_after)}" for r in results)


#: RATELIMIT['HEADER_DRAFT'] -> the functions that format `RateLimit-Policy` and `RateLimit`.
IETF_DRAFTS = {"draft-11": (policy_field, ratelimit_field)}




def apply_headers(response: HttpResponseBase, decision: Decision, policies: tuple[Policy, ...],
                  tier: str | None, mode: str, draft: str | None = None) -> None:
    """Add the headers chosen by `mode` ("legacy", "ietf" or "both") describing `decision`.

    `decision.results` are the results of `policies`, in order. A degraded decision (made without
    Redis) carries no real counts, so only the static fields (tier, policy) are sent for it. `draft`:
    the IETF draft the RateLimit fields follow (default: RATELIMIT['HEADER_DRAFT']).
    """
    headers = response.headers
    live = not decision.degraded and bool(decision.results)
    legacy = decision
    if mode != IETF and live and decision.allowed and len(policies) == len(decision.results) and needs_lease(
            policies):
        # the trio describes the rate limit nearest to refusing, not the free slots
        rates = tuple(r for p, r in zip(policies, decision.results, strict=True) if p.algorithm != CONCURRENCY)
        if rates:
            legacy = Decision.from_results(rates)
    if mode != IETF:
        if live:
            headers["X-RateLimit-Limit"] = str(legacy.limit)
            headers["X-RateLimit-Remaining"] = str(legacy.remaining)
            headers["X-RateLimit-Reset"] = str(_seconds(legacy.reset_after))
        if tier:
            headers["X-RateLimit-Tier"] = tier
    if mode != LEGACY:
        format_policies, format_state = IETF_DRAFTS[draft or request_settings().header_draft]
        if policies:
            headers["RateLimit-Policy"] = format_policies(policies)
        if live:
            headers["RateLimit"] = format_state(decision.results)


def retry_after_seconds(retry_after: float | None) -> int:
    """The `Retry-After` value of a refusal, the one rounding of it: whole seconds, rounded up, at least 1
    (1 when no time is known). A request that can never succeed (`math.inf`) has no Retry-After: the
    caller leaves the header out."""
    if retry_after is None or math.isinf(retry_after) or math.isnan(retry_after):
        return 1
    return max(1, math.ceil(retry_after))
