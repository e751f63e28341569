"""Tiers and API keys as request handling sees them (`TierInfo`, `KeyInfo`), read from the database as
plain rows (picklable: lookups share them through the Django cache) and compiled into policies once per
load, never per request."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..conf.settings import IP_POLICY_NAME, ip_policy
from ..core.logs import log_once
from ..core.policies import InvalidPolicy, Policy

if TYPE_CHECKING:
    from ..models import TierLimit


@dataclass(frozen=True, slots=True)
class TierInfo:
    """A tier as request handling sees it, with its enabled limits compiled into policies: `policies` without
    a scope, `scoped[scope]` those plus the limits of `scope`. `fail_mode` is None when the tier follows
    RATELIMIT['FAIL_MODE']. `ip_policies`: the tier's own per-IP limit (Tier.ip_rate); None when it sets
    none (RATELIMIT['IP_RATE'] applies); () for a client whose overrides replace or remove a tier limit,
    which no per-IP limit caps.
    """

    slug: str
    name: str
    fail_mode: str | None
    policies: tuple[Policy, ...]
    scoped: dict[str, tuple[Policy, ...]] = field(default_factory=dict, hash=False, compare=False)
    time_zone: str = "UTC"
    ip_policies: tuple[Policy, ...] | None = None
    #: the usage limits (policies with a unit) of each scope ("" for none), kept out of `policies_for`
    usage: dict[str, tuple[Policy, ...]] = field(init=False, hash=False, compare=False, repr=False)
    _requests: dict[str, tuple[Policy, ...]] = field(init=False, hash=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        usage, requests = {}, {}
        for scope, policies in (("", self.policies), *self.scoped.items()):
            if any(policy.unit for policy in policies):
                usage[scope] = tuple(policy for policy in policies if policy.unit)
                requests[scope] = tuple(policy for policy in policies if not policy.unit)
        object.__setattr__(self, "usage", usage)
        object.__setattr__(self, "_requests", requests)

    def every_policy(self) -> tuple[Policy, ...]:
        """Every policy of the tier: the unscoped ones, then each scope's own, each once."""
        seen: dict[str, Policy] = {}
        for policy in self.policies:
            seen.setdefault(policy.name, policy)
        for scope in sorted(self.scoped):
            for policy in self.scoped[scope]:
                seen.setdefault(policy.name, policy)
        return tuple(seen.values())

    def policies_for(self, scope: str | None) -> tuple[Policy, ...]:
        """The policies a request to a route declaring `scope` (None or "" for none) is checked against;
        its usage limits (`usage_for`) only when it reserves usage."""
        policies = self.scoped.get(scope, self.policies) if scope else self.policies
        if self._requests:
            return self._requests.get(scope if scope and scope in self.scoped else "", policies)
        return policies

    def usage_for(self, scope: str | None) -> tuple[Policy, ...]:
        """The usage limits of a route declaring `scope`: charged only by what a request reserves."""
        return self.usage.get(scope if scope and scope in self.scoped else "", ()) if self.usage else ()


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """An API key as request handling sees it: never the key itself, only its prefix and hash."""

    id: int
    prefix: str
    name: str
    hashed_key: str
    tier_slug: str
    revoked: bool
    expires_at: float | None  # Unix time, or None for never
    owner_id: int | None
    #: The key's own limits (ApiKeyLimit rows: name, algorithm, limit, period, burst, scope, enabled, shadow,
    #: calendar)
    overrides: tuple[tuple[Any, ...], ...] = ()

    def refusal(self, now: float) -> str | None:
        """Why the key is refused at Unix time `now` ("revoked" or "expired"), or None when usable."""
        if self.revoked:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return None


# -- database loaders: plain rows ---------------------------------------------------------------------
def load_tier_row(slug: str) -> tuple[Any, ...] | None:
    from ..models import Tier, TierLimit

    tier = (Tier.objects.filter(slug=slug)
            .values_list("id", "slug", "name", "fail_mode", "time_zone", "ip_rate").first())
    if tier is None:
        return None
    limits = list(
        TierLimit.objects.filter(tier_id=tier[0], enabled=True)
        .order_by("scope", "period", "id")
        .values_list("name", "algorithm", "limit", "period", "burst", "scope", "shadow", "calendar", "unit")
    )
    return (*tier[1:4], limits, *tier[4:])


def _policy_or_skip(row: TierLimit, time_zone: str, tier: str, client: str = "") -> Policy | None:
    """The policy of `row` (a TierLimit of `tier`, or an override of `client`: "key:ab12cd34"), or None
    when it cannot become one: the row is then skipped alone (the tier's other limits and the per-IP
    limit still apply), and logged once at ERROR."""
    try:
        return row.to_policy(time_zone)
    except InvalidPolicy as exc:
        log_once("ratelimit.limit_skipped", logging.ERROR, tier=tier, client=client, limit=row.policy_name,
                 problem=str(exc))
        return None


def build_tier(row: tuple[Any, ...]) -> TierInfo:
    """The TierInfo of a tier row (`load_tier_row`); a limit that cannot become a policy is skipped."""
    from ..models import TierLimit

    slug, name, fail_mode, limit_rows, time_zone, ip_rate = row
    base: list[Policy] = []
    by_scope: dict[str, list[Policy]] = {}
    for limit_name, algorithm, limit, period, burst, scope, shadow, calendar, unit in limit_rows:
        policy = _policy_or_skip(TierLimit(name=limit_name, algorithm=algorithm, limit=limit, period=period,
                                           burst=burst, scope=scope, shadow=shadow, calendar=calendar, unit=unit),
                                 time_zone, slug)
        if policy is None:
            continue
        (by_scope.setdefault(scope, []) if scope else base).append(policy)
    scoped = {scope: (*base, *policies) for scope, policies in by_scope.items()}
    return TierInfo(slug, name, fail_mode or None, tuple(base), scoped, time_zone, _ip_policies(ip_rate, slug))


def _ip_policies(ip_rate: str, tier: str) -> tuple[Policy, ...] | None:
    """The per-IP limit of a tier whose per-IP rate is `ip_rate`; None for none (""), and for one that
    cannot become a policy (a row written around the admin), which is logged once at ERROR: the default
    per-IP limit then applies."""
    if not ip_rate:
        return None
    try:
        return (ip_policy(ip_rate),)
    except InvalidPolicy as exc:
        log_once("ratelimit.limit_skipped", logging.ERROR, tier=tier, client="", limit=IP_POLICY_NAME,
                 problem=str(exc))
        return None


#: The columns of an override limit (ApiKeyLimit, UserTierLimit), in the order `apply_overrides` reads.
OVERRIDE_FIELDS = ("name", "algorithm", "limit", "period", "burst", "scope", "enabled", "shadow", "calendar",
                   "unit")


def apply_overrides(tier: TierInfo, overrides: tuple[tuple[Any, ...], ...], client: str = "") -> TierInfo:
    """`tier` with one client's own limits: an override whose scope and name are those of a tier limit
    replaces it (or, when disabled, removes it); any other enabled override is added. An enabled
    override that cannot become a policy is skipped (the tier limit it would replace stays), logged
    once as a limit of `client` ("key:ab12cd34", "user:5"). A client one of whose overrides replaces
    or removes a tier limit is held to its own limits alone: no per-IP limit (`ip_policies` is ()),
    which would otherwise cap what it was given; one whose overrides only add limits keeps its tier's."""
    from ..models import TierLimit

    base = list(tier.policies)
    own = {scope: list(policies[len(tier.policies):]) for scope, policies in tier.scoped.items()}
    ip_policies = tier.ip_policies
    for name, algorithm, limit, period, burst, scope, enabled, shadow, *rest in overrides:
        row = TierLimit(name=name, algorithm=algorithm, limit=limit, period=period, burst=burst, scope=scope,
                        shadow=shadow, calendar=rest[0] if rest else "", unit=rest[1] if len(rest) > 1 else "")
        policy = _policy_or_skip(row, tier.time_zone, tier.slug, client) if enabled else None
        if enabled and policy is None:
            continue
        target = own.setdefault(scope, []) if scope else base
        kept = [p for p in target if p.name != row.policy_name]
        replaced = len(kept) != len(target)
        if replaced:
            ip_policies = ()  # a tier limit replaced or removed: the client's own limits are its cap
        if policy is not None:
            index = next((i for i, p in enumerate(target) if p.name == row.policy_name), len(kept))
            kept.insert(index if replaced else len(kept), policy)
        target[:] = kept
    scoped = {scope: (*base, *policies) for scope, policies in own.items()}
    return TierInfo(tier.slug, tier.name, tier.fail_mode, tuple(base), scoped, tier.time_zone, ip_policies)


def load_key_row(prefix: str) -> tuple[Any, ...] | None:
    from ..models import ApiKey, ApiKeyLimit

    row = (
        ApiKey.objects.filter(prefix=prefix)
        .values_list("id", "prefix", "name", "hashed_key", "tier__slug", "revoked", "expires", "owner_id")
        .first()
    )
    if row is None:
        return None
    expires = row[6]
    overrides = tuple(ApiKeyLimit.objects.filter(api_key_id=row[0]).order_by("scope", "period", "id")
                      .values_list(*OVERRIDE_FIELDS))
    return (*row[:6], expires.timestamp() if expires is not None else None, row[7], overrides)


def load_user_plan(user_pk: str) -> tuple[str, tuple[tuple[Any, ...], ...]] | None:
    from ..models import UserTier, UserTierLimit

    row = UserTier.objects.filter(user_id=user_pk).values_list("id", "tier__slug").first()
    if row is None:
        return None
    overrides = tuple(UserTierLimit.objects.filter(user_tier_id=row[0]).order_by("scope", "period", "id")
                      .values_list(*OVERRIDE_FIELDS))
    return row[1], overrides


def load_client_rules(_: str) -> list[tuple[str, str, str | None]]:
    from ..models import ClientRule

    return list(ClientRule.objects.filter(enabled=True).values_list("action", "network", "api_key__prefix"))
