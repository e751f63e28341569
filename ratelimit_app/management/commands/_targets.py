"""What `ratelimit_status` and `ratelimit_reset` act on: an API key prefix, `user:<id>` or `ip:<address or
network>`, and the effective policies that limit it (docs/observability.md, "Commands for operators")."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from ratelimit_app.apply.identity import ip_identity
from ratelimit_app.apply.planning import limit_config, tier_ip_identity
from ratelimit_app.conf.settings import ratelimit_settings
from ratelimit_app.core.apikeys import PREFIX_LENGTH, parse_key
from ratelimit_app.core.policies import Policy
from ratelimit_app.plans.compile import TierInfo
from ratelimit_app.plans.lookups import get_lookups


@dataclass(frozen=True)
class TargetLimits:
    """One identity and the policies it is limited by (`label` says where they come from)."""

    identity: str
    policies: tuple[Policy, ...]
    label: str


@dataclass(frozen=True)
class Target:
    """What an operator named: a description for humans, the tier if any, and the checks to act on."""

    description: str
    tier: TierInfo | None
    checks: tuple[TargetLimits, ...]


def _tier(slug: str, where: str) -> TierInfo:
    tier = get_lookups().tier(slug)
    if tier is None:
        raise CommandError(f"{where} names tier {slug!r}, which does not exist")
    return tier


def _ip_target(text: str) -> Target:
    try:
        if "/" in text:
            identity = f"ip:{ipaddress.ip_network(text, strict=False)}"
        else:
            ipaddress.ip_address(text)
            identity = ip_identity(text, int(ratelimit_settings.IPV6_PREFIX))
    except ValueError as exc:
        raise CommandError(f"{text!r} is not an IP address or network ({exc})") from exc
    config = limit_config()
    checks = []
    if config.ip_policies:
        checks.append(TargetLimits(identity, config.ip_policies, "per-IP limit (RATELIMIT['IP_RATE'])"))
    checks += _tier_ip_limits(identity)
    tier = None
    if config.anonymous_tier is not None:
        tier = _tier(config.anonymous_tier, "RATELIMIT['ANONYMOUS_TIER']")
        checks.append(TargetLimits(identity, tier.every_policy(), f"anonymous tier {tier.slug}"))
    if not checks:
        raise CommandError(f"{identity} is not limited: RATELIMIT['IP_RATE'] and ['ANONYMOUS_TIER'] are None")
    return Target(f"client address {identity}", tier, tuple(checks))


def _tier_ip_limits(identity: str) -> list[TargetLimits]:
    """The per-IP limit of each tier that sets its own, on the client address `identity`."""
    from ratelimit_app.models import Tier

    found = []
    for slug in Tier.objects.exclude(ip_rate="").order_by("slug").values_list("slug", flat=True):
        tier = get_lookups().tier(slug)
        if tier is not None and tier.ip_policies:
            found.append(TargetLimits(tier_ip_identity(identity, slug), tier.ip_policies,
                                      f"per-IP limit of tier {slug}"))
    return found


def _user_target(text: str) -> Target:
    user_model = get_user_model()
    try:
        user = user_model._default_manager.filter(pk=text).first()
    except (ValueError, TypeError) as exc:
        raise CommandError(f"user:{text}: not a valid user id") from exc
    if user is None:
        raise CommandError(f"user:{text}: no such user")
    slug, overrides = get_lookups().user_plan(user.pk)
    where = f"the user tier of user {user.pk}"
    if slug is None:
        slug = ratelimit_settings.DEFAULT_USER_TIER
        where = "RATELIMIT['DEFAULT_USER_TIER']"
        if slug is None:
            raise CommandError(f"user:{user.pk} has no tier and RATELIMIT['DEFAULT_USER_TIER'] is None")
    return _client_target(f"user {user.pk} ({user})", f"user:{user.pk}", _tier(slug, where), overrides)


def _key_target(prefix: str) -> Target:
    from ratelimit_app.models import ApiKey

    api_key = ApiKey.objects.select_related("tier").filter(prefix=prefix).first()
    if api_key is None:
        raise CommandError(f"no API key with prefix {prefix!r}")
    info = get_lookups().key(prefix)
    state = "revoked" if api_key.revoked else ("expired" if api_key.is_expired else "active")
    return _client_target(f"API key {prefix} ({api_key.name}, {state})", f"key:{prefix}",
                          _tier(api_key.tier.slug, f"API key {prefix}"), info.overrides if info is not None else ())


def _client_target(description: str, identity: str, tier: TierInfo, overrides: tuple[tuple[Any, ...], ...]) -> Target:
    """A key or user limited by its tier, with its overrides applied."""
    tier = get_lookups().with_overrides(identity, tier, overrides)
    return Target(description, tier, (TargetLimits(identity, tier.every_policy(), f"tier {tier.slug}"),))


def resolve(text: str) -> Target:
    """The target an operator named; CommandError names what is wrong."""
    value = text.strip()
    scheme, colon, rest = value.partition(":")
    if colon and scheme == "ip":
        return _ip_target(rest)
    if colon and scheme == "user":
        return _user_target(rest)
    if colon and scheme == "key":
        value = rest
    elif colon:
        raise CommandError(f"{text!r}: expected ip:<address>, user:<id>, key:<prefix> or an API key prefix")
    full_key_prefix = parse_key(value)
    prefix = full_key_prefix or value
    if len(prefix) != PREFIX_LENGTH or not prefix.isalnum() or not prefix.isascii():
        shown = value.partition(".")[0][:PREFIX_LENGTH] + "…" if "." in value else value  # never what follows a dot
        raise CommandError(f"{shown!r} is not an API key prefix ({PREFIX_LENGTH} letters or digits), nor "
                           "ip:<address> or user:<id>")
    return _key_target(prefix)
