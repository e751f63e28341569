"""Limit one request in two steps: who is the client and which limits apply (`plan_request`), then
one all-or-nothing Redis call over every limit of ours that applies (`decide`).

This is the shared core of `RateLimitMiddleware`, the DRF throttles and `@ratelimit`; it returns a
`LimitOutcome` and leaves the HTTP answer to them.

`plan_request` checks, in order:

1. the client IP (trusted proxies only) -> identity `ip:<addr or IPv6 network>`;
2. an API key (X-API-Key / Authorization: Bearer), whose shape is checked before any lookup; else the
   authenticated user; else the anonymous tier (RATELIMIT['ANONYMOUS_TIER']) or 401.

`decide` then makes one call `hit_many([per-IP check, tier check, fleet check, *extra checks], cost)`
(the fleet check is the load shedder's count of requests in flight, when RATELIMIT['SHED_CAPACITY']
is set: see ratelimit_app.shedding); the extra
checks are those of our DRF throttles and of `@ratelimit` on the same view, so every limit of ours on
one request is charged at most once, and only if all of them allow.

A request whose key is missing, malformed, unknown, revoked or expired is still charged to the per-IP
limit (counted before authentication), so floods of invalid keys are limited. A key not yet cached in
this process is looked up only after a `peek` at the per-IP limit allows it, so an IP over its limit
causes no database query at all.

Whatever goes wrong inside the limiter at request time (a bug, a setting changed at run time, a tier
deleted while a setting names it) never fails the request: `safely` answers with the fail mode and
logs the error, with its traceback, once per cause.

Async code (the middleware under ASGI, `@ratelimit` on `async def` views) uses the awaitable
counterparts `alimit_request`, `aplan_request`, `adecide` and `asafely`: the same plan and the same
reading of Redis' reply (`_call_for` before the call, `_conclude` after it), with the call made
through the async service on the event loop. A warm request does no blocking work and no thread hop;
see `aplan_request` for the cold ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject, empty

from . import metrics, shedding
from .apikeys import key_matches, parse_key
from .clientrules import ALLOW, DENY, ClientRules
from .concurrency import HeldSlots, needs_lease, slots_taken
from .conf import DEFAULTS, SettingsCached, ratelimit_settings
from .decision import Decision, degraded_decision
from .engine import new_lease_token
from .exceptions import BACKEND_ERRORS
from .identity import (
    api_key_from_request,
    authenticated_user,
    client_ip,
    key_identity,
    request_ip_identity,
    user_identity,
)
from .limitcheck import LimitCheck
from .logs import logger
from .lookups import MISS, Lookups, NeedsIO, TierInfo, get_lookups, local_only, require_io
from .models import IP_POLICY_NAME
from .policies import Policy
from .routes import route_for_view
from .service import get_limiter
from .service_async import get_async_limiter

ALLOWED = "allowed"
DENIED = "denied"  # 429
UNAVAILABLE = "unavailable"  # 503: denied because the limiter is unavailable (fail mode)
UNAUTHORIZED = "unauthorized"  # 401
FORBIDDEN = "forbidden"  # 403: the client is deny-listed (ClientRule)
SHED = "shed"  # 503: refused by the load shedder (too many requests in flight)

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


def _read_limit_config() -> LimitConfig:
    # RATELIMIT is validated as a whole when it is read (conf.setting_errors), IP_RATE included.
    ip_rate = ratelimit_settings.IP_RATE
    ip_policies: tuple[Policy, ...] = ()
    if ip_rate is not None:
        parsed = Policy.parse(ip_rate, name=IP_POLICY_NAME, algorithm=ratelimit_settings.IP_ALGORITHM)
        ip_policies = (dataclasses.replace(parsed, shadow=bool(ratelimit_settings.IP_SHADOW)),)
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


_config = SettingsCached(_read_limit_config)


def limit_config() -> LimitConfig:
    """The parsed settings (parsed on first use and after every settings change, never per request)."""
    return _config.get()


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """Who the client is and which limits apply: everything known before Redis is asked.

    `checks` are the per-IP limit first, then the tier's (or, for a plan without a tier, what the
    throttles and decorator add). `refusal` is not "" when the request has no usable key or tier:
    it is then charged to the per-IP limit alone and answered 401 with that message if the IP may
    send. `tier_fail_mode` is the tier's own fail mode (None: RATELIMIT['FAIL_MODE']), `fail_mode` the
    one that applies. `label` names the decision in the metrics (the tier slug, "ip", "decorator"...).
    `listed` is "allow" when an allow rule (ClientRule) matched: the plan then has no checks, and
    none are added to it.
    """

    checks: tuple[LimitCheck, ...]
    tier: TierInfo | None
    identity: str
    fail_mode: str
    tier_fail_mode: str | None = None
    refusal: str = ""
    label: str = IP_ONLY_TIER
    listed: str = ""

    def plus(self, extra: Sequence[LimitCheck]) -> RequestPlan:
        """This plan with more checks decided in the same call (none for an allow-listed client)."""
        return dataclasses.replace(self, checks=self.checks + tuple(extra)) if extra and not self.listed else self


@dataclass(frozen=True, slots=True)
class LimitOutcome:
    """What limiting decided for one request.

    `status` is "allowed", "denied" (429), "unavailable" (503: the limiter is down and the fail mode
    refuses), "shed" (503: the load shedder refused; `message` is the request's priority) or
    "unauthorized" (401, `message` says why). `decision` summarises every policy checked
    (when denied: the policy that refused, so headers describe it; None when nothing was decided);
    `policies` are all the policies that applied, for the `RateLimit-Policy` header. `tier` is the
    client's tier when one was established; `identity` a display label ("key:<prefix>", "user:<pk>",
    "ip:<addr>"), never a full key. `charged` is False for report-only routes (cost 0), whose decision
    comes from `peek`. `checks` and `decisions` (same order; None where Redis Cluster stopped at the
    first denial) let each throttle or decorator read its own part. `slots` are the concurrency slots
    the request took (None: none); the caller gives them back when the response is finished
    (ratelimit_app.concurrency).
    """

    status: str
    decision: Decision | None
    policies: tuple[Policy, ...]
    tier: TierInfo | None
    identity: str
    message: str = ""
    charged: bool = True
    checks: tuple[LimitCheck, ...] = ()
    decisions: tuple[Decision | None, ...] = ()
    slots: HeldSlots | None = None

    @property
    def allowed(self) -> bool:
        """True when the request may proceed."""
        return self.status == ALLOWED

    @property
    def tier_slug(self) -> str | None:
        """The slug of the tier, or None when none was established."""
        return self.tier.slug if self.tier is not None else None

    def owns(self, owner: str) -> bool:
        """True when this outcome decided checks of `owner`."""
        return any(check.owner == owner for check in self.checks)

    def decision_for(self, owner: str) -> Decision | None:
        """The decision over the checks of `owner` alone (None when it had none). It allows when
        those limits allow, even if another check refused the request (which then charged nothing)."""
        mine = [d for check, d in zip(self.checks, self.decisions, strict=True) if check.owner == owner]
        if not mine:
            return None
        if any(d is None for d in mine):
            return self.decision  # Redis Cluster stopped at an earlier denial: this part was never decided
        return summarize([d for d in mine if d is not None], len(mine))


#: Passed as `user` to mean "read request.user".
FROM_REQUEST: Any = object()


def plan_request(request: HttpRequest, *, cost: int = 1, scope: str = "",
                 user: Any = FROM_REQUEST) -> RequestPlan | LimitOutcome:
    """Identify the client of `request` and the policies of its tier for `scope`.

    Returns a LimitOutcome instead when a per-IP peek already refuses a request with a key this
    process has not looked up yet (nothing is charged), or when a deny rule (ClientRule) matches the
    client (403, decided before any Redis call). An allow rule gives a plan without checks. `user` is
    the authenticated user to use instead of `request.user` (DRF authenticates on its own Request
    object). The tier's policies include the key's or user's own limits (overrides). Raises
    ImproperlyConfigured when a tier named in the settings or by a key does not exist.
    """
    config = limit_config()
    ip_id = request_ip_identity(request)
    lookups = get_lookups()
    rules = lookups.client_rules()
    listed = ""
    if not rules.empty and rules.has_networks:
        listed = rules.for_address(client_ip(request)) or ""
        if listed == DENY:
            return _denied_by_list(ip_id, "client network")
    ip_checks = (LimitCheck(ip_id, config.ip_policies),) if config.ip_policies and not listed else ()
    known = _Known(config, lookups, rules, ip_id, ip_checks, listed)
    raw_key = api_key_from_request(request)
    client = _key_client(known, raw_key, cost) if raw_key is not None else _user_client(request, known, user)
    if not isinstance(client, tuple):
        return client
    tier, identity, listed = client
    if listed:
        return RequestPlan((), tier, identity, tier.fail_mode or config.fail_mode, tier.fail_mode, label=tier.slug,
                           listed=ALLOW)
    checks = (*ip_checks, LimitCheck(identity, tier.policies_for(scope)))
    fleet = shedding.fleet_check(request, _declared_priority(request))
    if fleet is not None:
        checks = (*checks, fleet)
    return RequestPlan(checks, tier, identity, tier.fail_mode or config.fail_mode, tier.fail_mode, label=tier.slug)


@dataclass(frozen=True, slots=True)
class _Known:
    """What `plan_request` knows before it looks at the key or the user."""

    config: LimitConfig
    lookups: Lookups
    rules: ClientRules
    ip_id: str
    ip_checks: tuple[LimitCheck, ...]
    listed: str

    def refused(self, message: str, *, listed: bool = True) -> RequestPlan:
        """A plan charging the per-IP limit alone, answered 401 with `message` if the IP may send."""
        return RequestPlan(self.ip_checks, None, self.ip_id, self.config.fail_mode, refusal=message,
                           listed=self.listed if listed else "")


#: A client `plan_request` identified: its tier (overrides applied), its identity, and "allow" when an
#: allow rule matched it ("" otherwise).
_Client = tuple[TierInfo, str, str]


def _key_client(known: _Known, raw_key: str, cost: int) -> _Client | RequestPlan | LimitOutcome:
    """The client of an API key, or the plan (a 401) or outcome (a 403, or a per-IP 429) refusing it."""
    lookups, rules = known.lookups, known.rules
    prefix = parse_key(raw_key)
    if prefix is None:
        return known.refused("malformed API key")
    if prefix in rules.deny_keys:
        return _denied_by_list(key_identity(prefix), "API key")
    info = lookups.cached_key(prefix)
    if info is MISS:
        require_io()  # the lookup (and the peek before it) is I/O: an event loop makes it in a thread
        if known.ip_checks and prefix not in rules.allow_keys:
            # A key this process has not seen: make sure the IP may send at all before the lookup, so a
            # flood of random keys from one client costs no more than its per-IP limit.
            early = _ip_precheck(known.config, known.ip_id, cost)
            if early is not None:
                return early
        info = lookups.key(prefix)
    if info is None or not key_matches(raw_key, info.hashed_key):
        return known.refused("unknown API key")
    refusal = info.refusal(time.time())
    if refusal is not None:
        return known.refused(f"API key {refusal}")
    tier = lookups.tier(info.tier_slug)
    if tier is None:
        raise ImproperlyConfigured(f"API key {prefix} names tier {info.tier_slug!r}, which does not exist")
    identity = key_identity(prefix)
    # an allow rule on the key counts once the key is verified: a guessed prefix is not enough
    listed = ALLOW if prefix in rules.allow_keys else known.listed
    return lookups.with_overrides(identity, tier, info.overrides), identity, listed


def _user_client(request: HttpRequest, known: _Known, user: Any) -> _Client | RequestPlan:
    """The client of a request without a key: the user's tier (else DEFAULT_USER_TIER), else the
    anonymous tier per IP; else the plan refusing it (401, API key required)."""
    config, lookups = known.config, known.lookups
    if user is FROM_REQUEST:
        user = authenticated_user(request)
    slug, setting = None, ""
    overrides: tuple[tuple[Any, ...], ...] = ()
    if user is not None:
        slug, overrides = lookups.user_plan(user.pk)
        if slug is None and config.default_user_tier is not None:
            slug, setting = config.default_user_tier, "DEFAULT_USER_TIER"
    if slug is not None:
        identity = user_identity(user.pk)
    elif config.anonymous_tier is not None:
        slug, setting, identity = config.anonymous_tier, "ANONYMOUS_TIER", known.ip_id
    else:
        return known.refused("API key required", listed=False)
    tier = lookups.tier(slug)
    if tier is None:
        where = f"RATELIMIT['{setting}']" if setting else f"the user tier of user {user.pk}"
        raise ImproperlyConfigured(f"{where} names tier {slug!r}, which does not exist")
    return lookups.with_overrides(identity, tier, overrides), identity, known.listed


async def aplan_request(request: HttpRequest, *, cost: int = 1, scope: str = "",
                        user: Any = FROM_REQUEST) -> RequestPlan | LimitOutcome:
    """`plan_request` on the event loop, without blocking it.

    With this process' lookup cache warm (the tier, the key, the allow/deny rules), planning does no
    I/O and runs right here. When it would need the shared cache or the database (a cold cache, or a
    key this process has not seen, whose per-IP peek comes first), the whole plan is made in one
    `sync_to_async` call instead. A session user is read with Django's `request.auser()` (5.0+).
    """
    if user is FROM_REQUEST and api_key_from_request(request) is None:
        user = await request_user(request)
    try:
        with local_only():
            return plan_request(request, cost=cost, scope=scope, user=user)
    except NeedsIO:
        return await sync_to_async(plan_request)(request, cost=cost, scope=scope, user=user)


async def request_user(request: HttpRequest) -> Any:
    """The authenticated user of `request` (None when anonymous), read without blocking the loop.

    AuthenticationMiddleware leaves `request.user` lazy; reading it loads the session, which is I/O
    when the request carries a session cookie. That read is made with `request.auser()` (Django 5.0+)
    or one `sync_to_async` call, and `request.user` is set to the user found, so key functions and
    the view read it without I/O.
    """
    lazy = request.__dict__.get("user")
    if isinstance(lazy, SimpleLazyObject) and lazy._wrapped is empty:
        session = getattr(request, "session", None)
        if getattr(session, "session_key", None) is not None:
            auser = getattr(request, "auser", None)
            if auser is not None:
                request.user = await auser()
            else:  # Django 4.2
                await sync_to_async(authenticated_user)(request)
    return authenticated_user(request)


def _denied_by_list(identity: str, what: str) -> LimitOutcome:
    """403 for a deny-listed client, counted as denied-by-list; no Redis call is made."""
    metrics.record_decision(allowed=False, tier="list", policy=None, degraded=False, identity=identity,
                            listed=DENY)
    return LimitOutcome(FORBIDDEN, None, (), None, identity, f"{what} refused by an access rule", charged=False)


@dataclass(frozen=True, slots=True)
class _Call:
    """The Redis call one plan needs, before it is made: each check's (identity, policies), the cost
    (0: a report that charges nothing) and the lease under which concurrency slots are taken."""

    plan: RequestPlan
    pairs: list[tuple[str, tuple[Policy, ...]]]
    cost: int
    lease: str | None

    def degraded(self) -> list[Decision]:
        """The answer of the fail mode when the service raised instead of applying it."""
        return [degraded_decision(self.plan.fail_mode == "open")] * len(self.pairs)


def _call_for(plan: RequestPlan, cost: int) -> _Call | LimitOutcome:
    """The call `decide` makes for `plan`, or the outcome when no call is needed (no checks)."""
    if not plan.checks:  # nothing to charge: no per-IP limit and no usable key, or an allow-listed client
        status = UNAUTHORIZED if plan.refusal else ALLOWED
        if plan.listed and cost > 0:
            metrics.record_decision(allowed=True, tier=plan.label, policy=None, degraded=False,
                                    identity=plan.identity, unauthorized=status == UNAUTHORIZED, listed=ALLOW)
        return LimitOutcome(status, None, (), plan.tier, plan.identity, plan.refusal, cost > 0)
    if plan.refusal:
        cost = max(cost, 1)  # an unusable key is charged to the per-IP limit even on report-only routes
    pairs = [(check.identity, check.policies) for check in plan.checks]
    # a concurrency limit among them: the request's slot is taken in this same call, under a token
    taking = cost > 0 and needs_lease([policy for check in plan.checks for policy in check.policies])
    return _Call(plan, pairs, cost, new_lease_token() if taking else None)


def decide(plan: RequestPlan, cost: int) -> LimitOutcome:
    """Charge `cost` to every check of `plan` in one all-or-nothing call (cost 0: only report where
    the client stands), and count the request in the metrics once. `adecide` is the same, awaited."""
    call = _call_for(plan, cost)
    if isinstance(call, LimitOutcome):
        return call
    service = get_limiter()
    if call.cost == 0:
        decisions = []
        for identity, policies in call.pairs:  # fresh: a report shows the counts of now, not a cached denial's
            try:
                decisions.append(service.peek(identity, policies, fail_mode=plan.fail_mode, fresh=True))
            except BACKEND_ERRORS:
                decisions.append(degraded_decision(plan.fail_mode == "open"))
    else:
        try:
            decisions = service.hit_many(call.pairs, call.cost, fail_mode=plan.tier_fail_mode, lease=call.lease)
        except BACKEND_ERRORS:  # the service normally applies the fail mode itself
            decisions = call.degraded()
    outcome, unwanted = _conclude(call, decisions)
    if unwanted is not None:
        unwanted.release()
    return outcome


async def adecide(plan: RequestPlan, cost: int) -> LimitOutcome:
    """`decide` on the event loop: the same call through the async service (`get_async_limiter`)."""
    call = _call_for(plan, cost)
    if isinstance(call, LimitOutcome):
        return call
    service = get_async_limiter()
    if call.cost == 0:
        decisions = []
        for identity, policies in call.pairs:
            try:
                decisions.append(await service.peek(identity, policies, fail_mode=plan.fail_mode, fresh=True))
            except BACKEND_ERRORS:
                decisions.append(degraded_decision(plan.fail_mode == "open"))
    else:
        try:
            decisions = await service.hit_many(call.pairs, call.cost, fail_mode=plan.tier_fail_mode,
                                               lease=call.lease)
        except BACKEND_ERRORS:
            decisions = call.degraded()
    outcome, unwanted = _conclude(call, decisions)
    if unwanted is not None:
        await unwanted.arelease()
    return outcome


def _conclude(call: _Call, decisions: list[Decision]) -> tuple[LimitOutcome, HeldSlots | None]:
    """The outcome of `call` from Redis' `decisions`, counted in the metrics; and the slots to give
    back at once (taken by a request that was refused after all), or None."""
    plan, cost, checks, pairs = call.plan, call.cost, call.plan.checks, call.pairs
    # shadow policies never show in headers: they are reported apart (Decision.shadow); nor does the load
    # shedder's fleet count, which is not a limit of the client's
    policies = tuple(policy for check in checks if not check.owner.startswith(shedding.OWNER_PREFIX)
                     for policy in check.policies if not policy.shadow)
    slots = slots_taken(pairs, decisions, call.lease)
    summary = summarize(decisions, len(pairs))
    fleet = next((i for i, check in enumerate(checks) if check.owner.startswith(shedding.OWNER_PREFIX)), None)
    shed_priority: str | None = None
    if fleet is not None:
        fleet_decision = decisions[fleet] if fleet < len(decisions) else None
        kept = [i for i in range(len(checks)) if i != fleet]
        checks, pairs = tuple(checks[i] for i in kept), [pairs[i] for i in kept]
        decisions = [decisions[i] for i in kept if i < len(decisions)]
        shed_priority, summary = _fleet_verdict(call.plan.checks[fleet].owner, fleet_decision,
                                                summarize(decisions, len(kept)), summary, cost)
    if shed_priority is not None:
        status = SHED
    elif summary.allowed or cost == 0:  # a report-only request is never refused for where it stands
        status = UNAUTHORIZED if plan.refusal else ALLOWED
    else:
        status = UNAVAILABLE if summary.degraded else DENIED
    if cost > 0:
        _count(plan, summary, status, shed_priority, fleet is not None)
    unwanted = None
    if slots is not None and not summary.allowed:
        unwanted, slots = slots, None  # Redis Cluster charged the identities before the one that refused
    padded = tuple(decisions) + (None,) * (len(pairs) - len(decisions))
    message = plan.refusal if status == UNAUTHORIZED else shed_priority if status == SHED else ""
    outcome = LimitOutcome(status, summary, policies, plan.tier, plan.identity, message or "", cost > 0, checks,
                           padded, slots)
    return outcome, unwanted


def _fleet_verdict(owner: str, fleet_decision: Decision | None, own: Decision, summary: Decision,
                   cost: int) -> tuple[str | None, Decision]:
    """The load shedder's fleet count (checked by `owner`) was decided with the rest, but it is no
    limit of the client's: the priority it shed (None: it did not) and the summary the client is
    shown, from its own checks (`own`; the fleet slot, when taken, is among the request's slots)."""
    if cost > 0 and fleet_decision is not None and fleet_decision.results and not fleet_decision.results[0].allowed:
        shed_priority = shedding.priority_of_owner(owner)
        if shed_priority is not None:
            return shed_priority, fleet_decision.refused() if fleet_decision.allowed else fleet_decision
    return None, own.refused() if own.allowed and not summary.allowed else own


def _count(plan: RequestPlan, summary: Decision, status: str, shed_priority: str | None, fleet: bool) -> None:
    """Count one charged request in the metrics (and a shadow limit's would-be refusals, and the load
    shedder's episode)."""
    metrics.record_decision(
        allowed=summary.allowed, tier=plan.label,
        policy=None if summary.allowed else f"shed.{shed_priority}" if shed_priority else summary.policy,
        degraded=summary.degraded, identity=plan.identity, unauthorized=status == UNAUTHORIZED,
    )
    if summary.allowed and summary.shadow:
        would_block = summary.would_block
        if would_block:  # refusals a shadow limit would have made: counted, never answered
            metrics.record_shadow_blocked(tier=plan.label, policies=would_block, identity=plan.identity)
    if shed_priority is not None:
        shedding.fleet_episode.record_shed(shed_priority, {"identity": plan.identity})
    elif fleet and status == ALLOWED:
        shedding.fleet_episode.record_admitted()


def limit_request(request: HttpRequest, *, cost: int = 1, scope: str = "", user: Any = FROM_REQUEST,
                  extra: Sequence[LimitCheck] = ()) -> LimitOutcome:
    """`plan_request` then `decide`, with `extra` checks decided in the same call (a refusal for an
    unusable key charges the per-IP limit alone). Raises what `plan_request` raises."""
    planned = plan_request(request, cost=cost, scope=scope, user=user)
    if isinstance(planned, LimitOutcome):
        return planned
    return decide(planned if planned.refusal else planned.plus(extra), cost)


async def alimit_request(request: HttpRequest, *, cost: int = 1, scope: str = "", user: Any = FROM_REQUEST,
                         extra: Sequence[LimitCheck] | Callable[[], Sequence[LimitCheck]] = ()) -> LimitOutcome:
    """`limit_request` on the event loop: `aplan_request` then `adecide`. `extra` may be a callable
    that gives the extra checks, called once the request's user is known (a key function may read
    `request.user`)."""
    planned = await aplan_request(request, cost=cost, scope=scope, user=user)
    if isinstance(planned, LimitOutcome):
        return planned
    if planned.refusal:
        return await adecide(planned, cost)
    return await adecide(planned.plus(extra() if callable(extra) else extra), cost)


def summarize(decisions: Sequence[Decision], expected: int) -> Decision:
    """One decision over several identities' decisions: denied if any is (or if some are missing, as
    on Redis Cluster after the first denial); `results` holds every policy's result, in order."""
    results = tuple(r for d in decisions for r in d.results)
    degraded = any(d.degraded for d in decisions)
    denied = [d for d in decisions if not d.allowed]
    if not denied and len(decisions) == expected:
        if len(decisions) == 1 and not degraded:
            return decisions[0]
        return Decision.from_results(results, degraded=degraded, shadow=tuple(r for d in decisions for r in d.shadow))
    worst = max(denied, key=lambda d: d.retry_after if d.retry_after is not None else 0.0) if denied else None
    shadow = tuple(r for d in decisions for r in d.shadow)
    if worst is None:
        return Decision(False, 0, 0, 0.0, None, "", results, degraded, shadow)
    return dataclasses.replace(worst, allowed=False, results=results, degraded=degraded, shadow=shadow)


def _declared_priority(request: HttpRequest) -> str | None:
    """The load-shedding priority the resolved view declares (`@limit_cost(priority=...)`), or None."""
    match = getattr(request, "resolver_match", None)
    return route_for_view(match.func).priority if match is not None else None


def _ip_precheck(config: LimitConfig, ip_id: str, cost: int) -> LimitOutcome | None:
    """Peek at the per-IP limit; an outcome when it already refuses (nothing charged), else None.

    The peek goes through the service like every other call: its breaker, time budget and deny cache.
    """
    try:
        decision = get_limiter().peek(ip_id, config.ip_policies, max(cost, 1))
    except BACKEND_ERRORS:
        return None  # the charge that follows applies the fail mode
    if decision.allowed or decision.degraded:
        return None  # a limiter that cannot decide: the charge that follows applies the tier's fail mode
    metrics.record_decision(allowed=False, tier=IP_ONLY_TIER, policy=decision.policy, degraded=False,
                            identity=ip_id)
    check = LimitCheck(ip_id, config.ip_policies)
    return LimitOutcome(DENIED, decision, config.ip_policies, None, ip_id, checks=(check,), decisions=(decision,))


# -- when the limiter itself fails ------------------------------------------------------------------

#: Causes already logged with their traceback (bounded: a long-lived process logs each cause once).
_logged_causes: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()
MAX_LOGGED_CAUSES = 1000


def safely(limit: Callable[[], LimitOutcome], *, where: str, identity: str = "") -> LimitOutcome:
    """`limit()`, or, if it raises anything (a bug, an invalid setting met at run time), the answer of
    the fail mode: the limiter degrades, the request never fails because of it. The error is logged
    on "ratelimit_app" at ERROR with its traceback once per cause, then at DEBUG."""
    try:
        return limit()
    except Exception as exc:
        return _failed(exc, where, identity)


async def asafely(limit: Callable[[], Awaitable[LimitOutcome]], *, where: str, identity: str = "") -> LimitOutcome:
    """`safely` for async code: `await limit()`, or the answer of the fail mode if it raises."""
    try:
        return await limit()
    except Exception as exc:
        return _failed(exc, where, identity)


def _failed(exc: Exception, where: str, identity: str) -> LimitOutcome:
    """The fail mode's outcome when the limiter itself raised `exc` (logged once per cause)."""
    _log_once(exc, where)
    allowed = fail_mode() != "closed"
    with contextlib.suppress(Exception):
        metrics.record_decision(allowed=allowed, tier="error", policy=None if allowed else "error",
                                degraded=True, identity=identity or "unknown")
    return LimitOutcome(ALLOWED if allowed else UNAVAILABLE, degraded_decision(allowed), (), None, identity)


def fail_mode() -> str:
    """RATELIMIT['FAIL_MODE'], read even when other settings are invalid ("local" acts as "open" when
    the limiter cannot even say which limits apply)."""
    try:
        return str(ratelimit_settings.FAIL_MODE)
    except Exception:
        raw = getattr(django_settings, "RATELIMIT", None)
        mode = raw.get("FAIL_MODE") if isinstance(raw, dict) else None
        return mode if mode in ("open", "closed", "local") else str(DEFAULTS["FAIL_MODE"])


def _log_once(exc: Exception, where: str) -> None:
    cause = (type(exc).__qualname__, str(exc)[:200])
    with _logged_lock:
        first = cause not in _logged_causes
        if first and len(_logged_causes) < MAX_LOGGED_CAUSES:
            _logged_causes.add(cause)
    level = logging.ERROR if first else logging.DEBUG
    logger.log(level, "rate limiter failed in %s (%s: %s); the request follows the fail mode %r",
               where, type(exc).__name__, exc, fail_mode(), exc_info=exc if first else None,
               extra={"ratelimit_event": "ratelimit.internal_error"})
