"""Who is the client of a request, and which limits apply: `plan_request` (its async twin is in
ratelimit_app.apply.planning_async) turns a request into a `RequestPlan`, every check of which
ratelimit_app.apply.limiting decides in one Redis call. The order of the checks (client rules, API key,
user, REQUIRE_API_KEY, anonymous tier, per-IP limit) and which per-IP limit applies are in docs/usage.md.
A key this process has not cached is looked up only after a `peek` at the default per-IP limit allows
the address, so an address over it causes no database query at all.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from ..conf.paths import PathPrefixes, limited
from ..conf.settings import InvalidSetting, ip_policy
from ..conf.snapshot import Snapshot, request_settings
from ..core.apikeys import key_matches
from ..core.clientrules import ALLOW, DENY, ClientRules
from ..core.exceptions import BACKEND_ERRORS
from ..core.policies import Policy
from ..plans.compile import TierInfo
from ..plans.localcache import MISS
from ..plans.lookups import Lookups, get_lookups, require_io
from ..service import events
from ..service.limiter import get_limiter
from . import shedding
from .identity import (
    IdentityConfig,
    PresentedKey,
    api_key_from_request,
    authenticated_user,
    client_ip,
    identity_config,
    key_identity,
    offers_credential,
    request_ip_identity,
    user_identity,
)
from .limitcheck import LimitCheck
from .outcome import DENIED, FORBIDDEN, IP_ONLY_TIER, LimitOutcome
from .routes import route_of


@dataclass(frozen=True, slots=True)
class PathScope:
    """Which paths the middleware limits: ENABLED, PATH_PREFIXES and EXEMPT_PATHS, parsed."""

    enabled: bool
    path_prefixes: PathPrefixes
    exempt_paths: PathPrefixes

    def applies(self, path: str) -> bool:
        """True when the middleware limits `path` (`request.path_info`): on, and under a prefix and not
        exempt as sent or normalised (ratelimit_app.conf.paths: no reading escapes a limit)."""
        return self.enabled and limited(path, self.path_prefixes, self.exempt_paths)


def _read_path_scope(snapshot: Snapshot) -> PathScope:
    # ENABLED and EXEMPT_PATHS always have a reading (conf). PATH_PREFIXES that is no list of paths at all
    # has none: every path is then the middleware's, and the limiter, which cannot plan without it
    # (`limit_config` raises), answers each with the fail mode.
    try:
        prefixes = tuple(snapshot.get("PATH_PREFIXES"))
    except InvalidSetting:
        prefixes = ("/",)
    return PathScope(snapshot.enabled, PathPrefixes.of(prefixes), PathPrefixes.of(snapshot.get("EXEMPT_PATHS")))


def path_scope(snapshot: Snapshot | None = None) -> PathScope:
    """The paths the middleware limits (parsed once per settings snapshot)."""
    return (snapshot or request_settings()).derived(_read_path_scope)


@dataclass(frozen=True, slots=True)
class LimitConfig:
    """The settings request handling needs, read and validated once per settings change. Reading it
    raises InvalidSetting when one of them is invalid with no cautious reading; `path_prefixes` is among
    them (`path_scope` is what matches paths) so that a PATH_PREFIXES with none stops planning too."""

    path_prefixes: tuple[str, ...]
    ip_policies: tuple[Policy, ...]
    require_api_key: bool
    anonymous_tier: str | None
    default_user_tier: str | None
    headers: str
    fail_mode: str


def _read_limit_config(snapshot: Snapshot) -> LimitConfig:
    # RATELIMIT is validated as a whole when it is read (conf.settings.setting_errors), IP_RATE included.
    ip_rate = snapshot.get("IP_RATE")
    ip_policies = (ip_policy(ip_rate),) if ip_rate is not None else ()
    return LimitConfig(
        path_prefixes=tuple(snapshot.get("PATH_PREFIXES")),
        ip_policies=ip_policies,
        require_api_key=snapshot.get("REQUIRE_API_KEY"),
        anonymous_tier=snapshot.get("ANONYMOUS_TIER"),
        default_user_tier=snapshot.get("DEFAULT_USER_TIER"),
        headers=snapshot.get("HEADERS"),
        fail_mode=snapshot.fail_mode,
    )


def limit_config(snapshot: Snapshot | None = None) -> LimitConfig:
    """The parsed settings of planning (parsed once per settings snapshot, never per request); raises
    InvalidSetting when one of them has no reading."""
    return (snapshot or request_settings()).derived(_read_limit_config)


class RequestPlan(NamedTuple):
    """Who the client is and which limits apply: everything known before Redis is asked.

    `checks`: the per-IP limit first, then the tier's (and what throttles and decorators add). `refusal`:
    not "" when the request has no usable key or tier (charged to the per-IP limit alone, answered 401
    with it). `tier_fail_mode`: the tier's own (None: RATELIMIT['FAIL_MODE']); `fail_mode`: the one that
    applies. `label` names the decision in the metrics. `listed` is "allow" when an allow rule matched:
    the plan then has no checks, and none are added to it.
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
        return self._replace(checks=self.checks + tuple(extra)) if extra and not self.listed else self


#: Passed as `user` to mean "read request.user".
FROM_REQUEST: Any = object()


def plan_request(request: HttpRequest, *, cost: int = 1, scope: str = "", user: Any = FROM_REQUEST,
                 path: str | None = None, settings: Snapshot | None = None) -> RequestPlan | LimitOutcome:
    """Identify the client of `request` and the policies of its tier (overrides applied) for `scope`.

    A LimitOutcome instead when a per-IP peek already refuses a key this process has not looked up yet
    (nothing charged), or a deny rule matches the client (403, no Redis call). `user`: the authenticated
    user to use instead of `request.user` (DRF authenticates on its own Request). `path`: the path the
    load shedder's priority is read from when it is not `request`'s own (a gateway's described request).
    `settings`: the snapshot planned under (default: the current one). Raises ImproperlyConfigured when
    a tier named in the settings or by a key does not exist.
    """
    identities = identity_config(settings)
    return plan_with_key(request, api_key_from_request(request, identities), cost, scope, user, path, settings,
                         identities)


def plan_with_key(request: HttpRequest, key: PresentedKey | None, cost: int, scope: str, user: Any,
                  path: str | None, settings: Snapshot | None = None,
                  identities: IdentityConfig | None = None) -> RequestPlan | LimitOutcome:
    """`plan_request` for the API key of ours `key` the request carries (None: none), read once by the caller
    (under `identities`, the identity settings of `settings`, when it read them)."""
    config = limit_config(settings)
    identities = identities or identity_config(settings)
    ip_id = request_ip_identity(request, identities)
    lookups = get_lookups()
    rules = lookups.client_rules()
    listed = ""
    if not rules.empty and rules.has_networks:
        listed = rules.for_address(client_ip(request, identities)) or ""
        if listed == DENY:
            return _denied_by_list(ip_id, "client network")
    known = _Known(config, lookups, rules, ip_id, listed)
    client = _key_client(known, key, cost) if key is not None else _user_client(request, known, user)
    if isinstance(client, (RequestPlan, LimitOutcome)):
        return client
    tier, identity, listed = client
    tier_mode, label = (tier.fail_mode, tier.slug) if tier is not None else (None, IP_ONLY_TIER)
    if listed:
        return RequestPlan((), tier, identity, tier_mode or config.fail_mode, tier_mode, label=label, listed=ALLOW)
    checks = known.ip_checks() if tier is None else (
        *_ip_checks_of(tier, identity, known), LimitCheck(identity, tier.policies_for(scope)))
    fleet = shedding.fleet_check(request, _declared_priority, path, shedding.shed_config(settings))
    if fleet is not None:
        checks = (*checks, fleet)
    return RequestPlan(checks, tier, identity, tier_mode or config.fail_mode, tier_mode, label=label)


class _Known(NamedTuple):
    """What `plan_request` knows before it looks at the key or the user."""

    config: LimitConfig
    lookups: Lookups
    rules: ClientRules
    ip_id: str
    listed: str

    def ip_checks(self) -> tuple[LimitCheck, ...]:
        """The default per-IP check (IP_RATE) of the address, unless an allow rule matched it; made when asked."""
        return (LimitCheck(self.ip_id, self.config.ip_policies),) if self.config.ip_policies and not self.listed else ()

    def refused(self, message: str, *, listed: bool = True) -> RequestPlan:
        """A plan charging the per-IP limit alone, answered 401 with `message` if the IP may send."""
        return RequestPlan(self.ip_checks(), None, self.ip_id, self.config.fail_mode, refusal=message,
                           listed=self.listed if listed else "")


#: A client `plan_request` identified: its tier (overrides applied; None: the per-IP limit alone), its
#: identity, and "allow" when an allow rule matched it ("" otherwise).
_Client = tuple[TierInfo | None, str, str]


def _key_client(known: _Known, key: PresentedKey, cost: int) -> _Client | RequestPlan | LimitOutcome:
    """The client of an API key of ours, or the plan (a 401) or outcome (a 403, or a per-IP 429) refusing it."""
    lookups, rules, prefix = known.lookups, known.rules, key.prefix
    if prefix in rules.deny_keys:
        return _denied_by_list(key_identity(prefix), "API key")
    info = lookups.cached_key(prefix, fresh=False)  # plan_with_key read the rules: the cache is fresh
    if info is MISS:
        require_io()  # the lookup (and the peek before it) is I/O: an event loop makes it in a thread
        if known.ip_checks() and prefix not in rules.allow_keys:
            # A key this process has not seen: make sure the IP may send at all before the lookup, so a
            # flood of random keys from one client costs no more than its per-IP limit.
            early = _ip_precheck(known.config, known.ip_id, cost)
            if early is not None:
                return early
        info = lookups.key(prefix)
    if info is None or not key_matches(key.key, info.hashed_key):
        return known.refused("unknown API key")
    refusal = info.refusal(time.time())
    if refusal is not None:
        return known.refused(f"API key {refusal}")
    tier = lookups.tier(info.tier_slug, fresh=False)
    if tier is None:
        raise ImproperlyConfigured(f"API key {prefix} names tier {info.tier_slug!r}, which does not exist")
    identity = key_identity(prefix)
    # an allow rule on the key counts once the key is verified: a guessed prefix is not enough
    listed = ALLOW if prefix in rules.allow_keys else known.listed
    return lookups.with_overrides(identity, tier, info.overrides), identity, listed


def _user_client(request: HttpRequest, known: _Known, user: Any) -> _Client | RequestPlan:
    """The client of a request without a key of ours: the user's tier (else DEFAULT_USER_TIER); else, under
    REQUIRE_API_KEY, the plan refusing it (401: a malformed key when it offered a credential not ours, else a
    key required); else the anonymous tier per IP; else the per-IP limit alone."""
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
    elif config.require_api_key:
        return known.refused("malformed API key" if offers_credential(request) else "API key required", listed=False)
    elif config.anonymous_tier is not None:
        slug, setting, identity = config.anonymous_tier, "ANONYMOUS_TIER", known.ip_id
    else:
        return None, known.ip_id, known.listed
    tier = lookups.tier(slug, fresh=False)
    if tier is None:
        where = f"RATELIMIT['{setting}']" if setting else f"the user tier of user {user.pk}"
        raise ImproperlyConfigured(f"{where} names tier {slug!r}, which does not exist")
    return lookups.with_overrides(identity, tier, overrides), identity, known.listed


def _ip_checks_of(tier: TierInfo, identity: str, known: _Known) -> tuple[LimitCheck, ...]:
    """The per-IP limit of the client `identity` planned under `tier`: the tier's own, counted per
    address and tier (`ip:<address>@<tier>`: the tier's keys and users from one address share it, apart
    from other tiers'); the default (RATELIMIT['IP_RATE']), counted per address with every request
    without a usable key, for a tier that sets none and for the anonymous tier (a client known by its
    address alone); none for a client whose overrides are its cap (TierInfo.ip_policies)."""
    own = tier.ip_policies
    if own is None or identity == known.ip_id:
        return known.ip_checks()
    return (LimitCheck(tier_ip_identity(known.ip_id, tier.slug), own),) if own else ()


def tier_ip_identity(ip_id: str, slug: str) -> str:
    """The identity a tier's own per-IP limit counts the client address `ip_id` ("ip:203.0.113.7") under,
    for the tier `slug`: "ip:203.0.113.7@pro"."""
    return f"{ip_id}@{slug}"


def _denied_by_list(identity: str, what: str) -> LimitOutcome:
    """403 for a deny-listed client, counted as denied-by-list; no Redis call is made."""
    events.record_decision(allowed=False, tier="list", policy=None, degraded=False, identity=identity,
                            listed=DENY)
    return LimitOutcome(FORBIDDEN, None, (), None, identity, f"{what} refused by an access rule", charged=False)


def _declared_priority(request: HttpRequest) -> str | None:
    """The load-shedding priority the resolved view declares (`@limit_cost(priority=...)`), or None."""
    match = getattr(request, "resolver_match", None)
    return route_of(match.func, request).route.priority if match is not None else None


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
    events.record_decision(allowed=False, tier=IP_ONLY_TIER, policy=decision.policy, degraded=False,
                            identity=ip_id)
    check = LimitCheck(ip_id, config.ip_policies)
    return LimitOutcome(DENIED, decision, config.ip_policies, None, ip_id, checks=(check,), decisions=(decision,))
