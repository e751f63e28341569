"""Rate limit response headers: legacy `X-RateLimit-*` and the IETF draft `RateLimit-Policy` / `RateLimit`
(RATELIMIT['HEADERS']: "legacy", "ietf" or "both"; RATELIMIT['HEADER_DRAFT'] picks the IETF revision).
What each field means, for every algorithm, is in docs/usage.md."""

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
    """Whole seconds, rounded up (a client that waits this long is never early); 0 for none or infinity."""
    return 0 if value <= 0 or math.isinf(value) else math.ceil(value)


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
    # one comprehension with `_seconds` written out: this runs on every response
    return ", ".join([f"{_sf_string(r.policy)};r={r.remaining};t="
                      f"{0 if r.reset_after <= 0 or math.isinf(r.reset_after) else math.ceil(r.reset_after)}"
                      for r in results])


#: RATELIMIT['HEADER_DRAFT'] -> the functions that format `RateLimit-Policy` and `RateLimit`.
IETF_DRAFTS = {"draft-11": (policy_field, ratelimit_field)}


def apply_headers(response: HttpResponseBase, decision: Decision, policies: tuple[Policy, ...],
                  tier: str | None, mode: str, draft: str | None = None) -> None:
    """Add the headers chosen by `mode` ("legacy", "ietf" or "both") describing `decision`, whose results are
    those of `policies`, in order; only the static fields (tier, policy) for a degraded decision (no real
    counts). `draft`: the IETF draft of the RateLimit fields (default: RATELIMIT['HEADER_DRAFT'])."""
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
