"""`manage.py check --database default`: plan rows written around the admin that cannot be enforced as
stored, each given every field's validation and the model's own (ratelimit.E030-E032, W030:
docs/settings.md)."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import DatabaseError, models

from ..conf.settings import InvalidSetting, ip_policy, ratelimit_settings
from ..core.policies import CONCURRENCY, InvalidPolicy

#: The foreign keys of each checked model: their rows exist (the database says so), and validating
#: them would cost one query per row.
_RELATIONS = ("tier", "api_key", "user_tier")


def _problem(exc: ValidationError) -> str:
    """What is wrong with a row: each field at fault and its errors (errors of no one field, alone)."""
    if not hasattr(exc, "error_dict"):
        return " ".join(exc.messages)
    return "; ".join(" ".join(errors) if field == NON_FIELD_ERRORS else f"{field}: {' '.join(errors)}"
                     for field, errors in exc.message_dict.items())


def row_problem(row: models.Model) -> str | None:
    """What keeps a stored plan row from being enforced as stored ("limit: ..."), or None: every field's
    validation, then the model's own, as the admin's form runs them (without the database's own
    uniqueness and constraints, which it enforced when the row was written)."""
    exclude = [name for name in _RELATIONS if any(field.name == name for field in row._meta.fields)]
    try:
        row.full_clean(exclude=exclude, validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        return _problem(exc)
    return None


@checks.register("ratelimit", checks.Tags.database)
def check_stored_plans(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Validate every stored Tier, TierLimit, ApiKeyLimit, UserTierLimit and ClientRule as the admin does."""
    if not databases:
        return []
    try:
        return [*_tier_messages(), *_limit_messages(), *_rule_messages(), *_capped_tier_messages()]
    except DatabaseError:  # not migrated yet: `migrate` comes first
        return []


def _tier_messages() -> list[checks.CheckMessage]:
    from ..models import Tier

    return [checks.Error(f"tier {tier.slug!r}: {problem}", id="ratelimit.E030", hint=_tier_hint(problem))
            for tier in Tier.objects.all() if (problem := row_problem(tier)) is not None]


def _tier_hint(problem: str) -> str:
    """What to do about a tier's `problem`, and what requests get until then."""
    if "ip_rate:" in problem:
        return ("Fix the tier in the admin; until then its requests are held to the default per-IP limit "
                "(RATELIMIT['IP_RATE']) instead of its own.")
    return "Fix the tier in the admin."


def _limit_messages() -> list[checks.CheckMessage]:
    from ..models import ApiKeyLimit, TierLimit, UserTierLimit

    messages: list[checks.CheckMessage] = []
    owners = ((TierLimit, "tier", lambda row: f"tier {row.tier.slug!r}"),
              (ApiKeyLimit, "api_key__tier",
               lambda row: f"API key {row.api_key.prefix} (tier {row.api_key.tier.slug!r})"),
              (UserTierLimit, "user_tier__tier",
               lambda row: f"user {row.user_tier.user_id} (tier {row.user_tier.tier.slug!r})"))
    for model, related, owner in owners:
        for row in model.objects.select_related(related):
            problem = row_problem(row)
            if problem is not None:
                messages.append(checks.Error(
                    f"{model._meta.verbose_name} {row.pk} ({row.name}) of {owner(row)}: {problem}",
                    id="ratelimit.E031",
                    hint="The limit is skipped alone at run time (the other limits of its tier and the per-IP "
                         "limit still apply) until it is fixed in the admin."))
    return messages


def _rule_messages() -> list[checks.CheckMessage]:
    from ..models import ClientRule

    return [checks.Error(f"client rule {rule.pk}: {problem}", id="ratelimit.E032",
                         hint="The rule is ignored until it is fixed in the admin.")
            for rule in ClientRule.objects.select_related("api_key") if (problem := row_problem(rule)) is not None]


def _capped_tier_messages() -> list[checks.CheckMessage]:
    """ratelimit.W030 for each tier whose per-IP limit (its own, else RATELIMIT['IP_RATE']) allows one
    address a lower sustained rate (limit per second) than one of the tier's enforced limits."""
    from ..models import Tier
    from .compile import build_tier, load_tier_row

    try:
        rate = ratelimit_settings.IP_RATE
        default = (ip_policy(rate),) if rate is not None else ()
        tiers = [build_tier(row) for slug in Tier.objects.values_list("slug", flat=True)
                 if (row := load_tier_row(slug)) is not None]
    except (InvalidSetting, InvalidPolicy):
        return []  # ratelimit.E001 says why
    messages: list[checks.CheckMessage] = []
    for tier in tiers:
        own = tier.ip_policies is not None
        applied = tier.ip_policies if tier.ip_policies is not None else default
        if not applied or applied[0].shadow:
            continue  # no per-IP limit, or one that never refuses
        ip = applied[0]
        source = f"the tier's per-IP rate {ip.rate}" if own else f"RATELIMIT['IP_RATE'] {ip.rate}"
        capped = [p for p in tier.every_policy() if p.algorithm != CONCURRENCY and not p.shadow and not p.unit
                  and p.limit / p.period > ip.limit / ip.period]  # (a usage limit counts units, not requests)
        if capped:
            messages.append(checks.Warning(
                f"tier {tier.slug!r}: its per-IP limit ({source}) refuses one client address before its limit "
                f"{capped[0].name!r} ({capped[0].rate}) does: a key of the tier is capped below its own limits",
                id="ratelimit.W030",
                hint="Give the tier a per-IP rate at least its own limits' in the admin (docs/plans.md, "
                     "\"The per-IP limit\")."))
    return messages
