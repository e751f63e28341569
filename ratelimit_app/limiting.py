"""Limit one request: identify the client, find its tier, and decide in one Redis round trip.

This is the shared core of `RateLimitMiddleware` and `TierRateThrottle`; it returns a `LimitOutcome`
and leaves the HTTP answer to them. The order of checks:

1. the client IP (trusted proxies only) -> identity `ip:<addr or IPv6 network>`;
2. an API key (X-API-Key / Authorization: Bearer), whose shape is checked before any lookup; else the
   authenticated user; else the anonymous tier (RATELIMIT['ANONYMOUS_TIER']) or 401;
3. one call `hit_many([(ip, [ip policy]), (identity, tier policies)], cost)`: all-or-nothing across both.

A request whose key is missing, malformed, unknown, revoked or expired is still charged to the per-IP
limit (counted before authentication), so floods of invalid keys are limited. A key not yet cached in
this process is looked up only after a `peek` at the per-IP limit allows it, so an IP over its limit
causes no database query at all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from redis.exceptions import RedisClusterException, RedisError

from . import metrics
from .apikeys import key_matches, parse_key
from .conf import SettingsCached, ratelimit_settings
from .decision import Decision
from .exceptions import RateLimiterError
from .identity import (
    api_key_from_request,
    authenticated_user,
    key_identity,
    request_ip_identity,
    user_identity,
)
from .lookups import MISS, TierInfo, get_lookups
from .models import IP_POLICY_NAME
from .policies import InvalidPolicy, Policy
from .service import get_limiter

ALLOWED = "allowed"
DENIED = "denied"  # 429
UNAVAILABLE = "unavailable"  # 503: denied because the limiter is unavailable (fail mode)
UNAUTHORIZED = "unauthorized"  # 401

#: What a limiter call may raise when Redis cannot decide (the service normally answers with its fail
#: mode instead; these are caught as a last resort so a request never fails because of Redis).
LIMITER_ERRORS = (RateLimiterError, RedisError, RedisClusterException, OSError)

#: Tier label of decisions made on the per-IP limit alone (no valid key or tier yet).
IP_ONLY_TIER = "ip"


@dataclass(frozen=True, slots=True)
class LimitConfig:
    """The settings request handling needs, read and validated once per settings change."""

    enabled: bool
    path_prefixes: tuple[str, ...]
    exempt_paths: tuple[str, ...]
    ip_policies: tuple[Policy, ...]
    anonymous_tier: str | None
    default_user_tier: str | None
    headers: str
    fail_mode: str

    def applies(self, path: str) -> bool:
        """True when the middleware limits `path` (under a prefix and not exempt)."""
        return path.startswith(self.path_prefixes) and not path.startswith(self.exempt_paths)


def _parse_config() -> LimitConfig:
    ip_rate = ratelimit_settings.IP_RATE
    ip_policies: tuple[Policy, ...] = ()
    if ip_rate is not None:
        try:
            ip_policies = (Policy.parse(ip_rate, name=IP_POLICY_NAME, algorithm=ratelimit_settings.IP_ALGORITHM),)
        except InvalidPolicy as exc:
            raise ImproperlyConfigured(
                f"RATELIMIT['IP_RATE'] / ['IP_ALGORITHM'] = {ip_rate!r} / {ratelimit_settings.IP_ALGORITHM!r}: {exc}"
            ) from exc
    for name in ("ANONYMOUS_TIER", "DEFAULT_USER_TIER"):
        value = getattr(ratelimit_settings, name)
        if value is not None and (not isinstance(value, str) or not value):
            raise ImproperlyConfigured(f"RATELIMIT['{name}'] is {value!r}; expected a tier slug or None")
    return LimitConfig(
        enabled=bool(ratelimit_settings.ENABLED),
        path_prefixes=tuple(ratelimit_settings.PATH_PREFIXES),
        exempt_paths=tuple(ratelimit_settings.EXEMPT_PATHS),
        ip_policies=ip_policies,
        anonymous_tier=ratelimit_settings.ANONYMOUS_TIER,
        default_user_tier=ratelimit_settings.DEFAULT_USER_TIER,
        headers=ratelimit_settings.HEADERS,
        fail_mode=ratelimit_settings.FAIL_MODE,
    )


_config = SettingsCached(_parse_config)


def get_config() -> LimitConfig:
    """The parsed settings (parsed on first use and after every settings change, never per request)."""
    return _config.get()


@dataclass(frozen=True, slots=True)
class LimitOutcome:
    """What limiting decided for one request.

    `status` is "allowed", "denied" (429), "unavailable" (503: the limiter is down and the fail mode
    refuses) or "unauthorized" (401, `message` says why). `decision` summarises every policy checked
    (per-IP and tier; None when nothing was decided); `policies` are all the policies that applied, for
    the `RateLimit-Policy` header. `tier` is the client's tier when one was established; `identity` a
    display label ("key:<prefix>", "user:<pk>", "ip:<addr>"), never a full key. `charged` is False for
    report-only routes (cost 0), whose decision comes from `peek`.
    """

    status: str
    decision: Decision | None
    policies: tuple[Policy, ...]
    tier: TierInfo | None
    identity: str
    message: str = ""
    charged: bool = True

    @property
    def allowed(self) -> bool:
        """True when the request may proceed."""
        return self.status == ALLOWED

    @property
    def tier_slug(self) -> str | None:
        """The slug of the tier, or None when none was established."""
        return self.tier.slug if self.tier is not None else None


#: Passed as `user` to mean "read request.user".
FROM_REQUEST: Any = object()


def limit_request(request: HttpRequest, *, cost: int = 1, scope: str = "", user: Any = FROM_REQUEST) -> LimitOutcome:
    """Identify the client of `request`, and charge `cost` to its per-IP limit and its tier's policies
    for `scope` (cost 0: only report where it stands). Counts the decision in the metrics once.

    `user` is the authenticated user to use instead of `request.user` (DRF authenticates on its own
    Request object). Raises ImproperlyConfigured when a tier named in the settings does not exist.
    """
    config = get_config()
    ip_id = request_ip_identity(request)
    ip_policies = config.ip_policies
    lookups = get_lookups()
    raw_key = api_key_from_request(request)
    tier: TierInfo | None
    if raw_key is not None:
        prefix = parse_key(raw_key)
        if prefix is None:
            return _refuse(config, ip_id, cost, "malformed API key")
        info = lookups.cached_key(prefix)
        if info is MISS:
            if ip_policies:
                # A key this process has not seen: make sure the IP may send at all before the lookup,
                # so a flood of random keys from one client costs no more than its per-IP limit.
                early = _ip_precheck(config, ip_id, cost)
                if early is not None:
                    return early
            info = lookups.key(prefix)
        if info is None or not key_matches(raw_key, info.hashed_key):
            return _refuse(config, ip_id, cost, "unknown API key")
        refusal = info.refusal(time.time())
        if refusal is not None:
            return _refuse(config, ip_id, cost, f"API key {refusal}")
        tier = lookups.tier(info.tier_slug)
        if tier is None:
            raise ImproperlyConfigured(f"API key {prefix} names tier {info.tier_slug!r}, which does not exist")
        identity = key_identity(prefix)
    else:
        if user is FROM_REQUEST:
            user = authenticated_user(request)
        slug, setting = None, ""
        if user is not None:
            slug = lookups.user_tier_slug(user.pk)
            if slug is None and config.default_user_tier is not None:
                slug, setting = config.default_user_tier, "DEFAULT_USER_TIER"
        if slug is not None:
            identity = user_identity(user.pk)
        elif config.anonymous_tier is not None:
            slug, setting, identity = config.anonymous_tier, "ANONYMOUS_TIER", ip_id
        else:
            return _refuse(config, ip_id, cost, "API key required")
        tier = lookups.tier(slug)
        if tier is None:
            where = f"RATELIMIT['{setting}']" if setting else f"the user tier of user {user.pk}"
            raise ImproperlyConfigured(f"{where} names tier {slug!r}, which does not exist")

    policies = tier.policies_for(scope)
    checks: list[tuple[str, tuple[Policy, ...]]] = [(identity, policies)]
    if ip_policies:
        checks.insert(0, (ip_id, ip_policies))
    all_policies = ip_policies + policies
    fail_mode = tier.fail_mode
    if cost == 0:
        return _report(checks, all_policies, tier, identity, fail_mode or config.fail_mode)
    try:
        decisions = get_limiter().hit_many(checks, cost, fail_mode=fail_mode)
    except LIMITER_ERRORS:
        return _failed(fail_mode or config.fail_mode, all_policies, tier, identity)
    summary = summarize(decisions, len(checks))
    return _decided(summary, all_policies, tier, identity)


def summarize(decisions: list[Decision], expected: int) -> Decision:
    """One decision over several identities' decisions: denied if any is (or if some are missing, as
    on Redis Cluster after the first denial); `results` holds every policy's result, in order."""
    results = tuple(r for d in decisions for r in d.results)
    degraded = any(d.degraded for d in decisions)
    denied = [d for d in decisions if not d.allowed]
    if not denied and len(decisions) == expected:
        if len(decisions) == 1 and not degraded:
            return decisions[0]
        return Decision.from_results(results, degraded=degraded)
    worst = max(denied, key=lambda d: d.retry_after if d.retry_after is not None else 0.0) if denied else None
    if worst is None:
        return Decision(False, 0, 0, 0.0, None, "", results, degraded)
    return dataclasses.replace(worst, allowed=False, results=results, degraded=degraded)


def _decided(summary: Decision, policies: tuple[Policy, ...], tier: TierInfo | None, identity: str) -> LimitOutcome:
    if summary.allowed:
        status = ALLOWED
    else:
        status = UNAVAILABLE if summary.degraded else DENIED
    metrics.record_decision(
        allowed=summary.allowed, tier=tier.slug if tier is not None else IP_ONLY_TIER,
        policy=None if summary.allowed else summary.policy, degraded=summary.degraded, identity=identity,
    )
    return LimitOutcome(status, summary, policies, tier, identity)


def _failed(fail_mode: str, policies: tuple[Policy, ...], tier: TierInfo | None, identity: str) -> LimitOutcome:
    """The limiter raised instead of answering (the service normally applies the fail mode itself)."""
    allowed = fail_mode == "open"
    decision = Decision(allowed, 0, 0, 0.0, None if allowed else 1.0, "", (), degraded=True)
    return _decided(decision, policies, tier, identity)


def _ip_precheck(config: LimitConfig, ip_id: str, cost: int) -> LimitOutcome | None:
    """Peek at the per-IP limit; an outcome when it already refuses (nothing charged), else None."""
    try:
        decision = get_limiter().peek(ip_id, config.ip_policies, max(cost, 1))
    except LIMITER_ERRORS:
        return None  # the charge that follows applies the fail mode
    if decision.allowed or decision.degraded:
        return None  # a limiter that cannot decide: the charge that follows applies the tier's fail mode
    return _decided(decision, config.ip_policies, None, ip_id)


def _refuse(config: LimitConfig, ip_id: str, cost: int, message: str) -> LimitOutcome:
    """No usable key or tier: charge the per-IP limit alone, then 401 (or 429/503 if the IP is over)."""
    if not config.ip_policies:
        return LimitOutcome(UNAUTHORIZED, None, (), None, ip_id, message)
    try:
        decision = get_limiter().hit(ip_id, config.ip_policies, max(cost, 1))
    except LIMITER_ERRORS:
        outcome = _failed(config.fail_mode, config.ip_policies, None, ip_id)
    else:
        outcome = _decided(decision, config.ip_policies, None, ip_id)
    if outcome.status != ALLOWED:
        return outcome
    return dataclasses.replace(outcome, status=UNAUTHORIZED, message=message)


def _report(checks: list[tuple[str, tuple[Policy, ...]]], policies: tuple[Policy, ...], tier: TierInfo,
            identity: str, fail_mode: str) -> LimitOutcome:
    """Cost 0: where the client stands in every policy, charging nothing (one peek per identity)."""
    service = get_limiter()
    decisions = []
    for ident, pols in checks:
        try:
            decision = service.peek(ident, pols, fail_mode=fail_mode)
        except LIMITER_ERRORS:
            decision = Decision(fail_mode == "open", 0, 0, 0.0, None, "", (), degraded=True)
        if not decision.allowed and not decision.degraded:
            # A denial may come from the service's local deny cache, whose counts are those of the
            # moment Redis denied; a report must show the counts of now (Redis answered just now).
            with contextlib.suppress(*LIMITER_ERRORS):
                decision = service.limiter.peek(ident, pols)
        decisions.append(decision)
    return LimitOutcome(ALLOWED, summarize(decisions, len(checks)), policies, tier, identity, charged=False)
