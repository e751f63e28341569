"""`manage.py check --database default`: plan rows that cannot be enforced as stored.

The admin validates every row it saves; these checks find rows written around it (a data migration,
`QuerySet.update`, raw SQL), which the request path would otherwise meet at run time (and answer with
the fail mode). Ids: ratelimit.E030 a tier with an unknown time zone, ratelimit.E031 a tier limit or a
limit override that cannot be enforced, ratelimit.E032 an allow/deny rule that names no valid network
or key (it is then ignored).
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import DatabaseError


def _problem(exc: ValidationError) -> str:
    """What is wrong with a row: each field at fault and its errors (errors of no one field, alone)."""
    if not hasattr(exc, "error_dict"):
        return " ".join(exc.messages)
    return "; ".join(" ".join(errors) if field == NON_FIELD_ERRORS else f"{field}: {' '.join(errors)}"
                     for field, errors in exc.message_dict.items())


@checks.register("ratelimit", checks.Tags.database)
def check_stored_plans(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Validate every stored Tier, TierLimit, ApiKeyLimit, UserTierLimit and ClientRule as the admin does."""
    if not databases:
        return []
    from ..models import ApiKeyLimit, ClientRule, Tier, TierLimit, UserTierLimit

    messages: list[checks.CheckMessage] = []
    try:
        for tier in Tier.objects.all():
            try:
                tier.clean()
            except ValidationError as exc:
                messages.append(checks.Error(f"tier {tier.slug!r}: {_problem(exc)}", id="ratelimit.E030",
                                             hint="Fix the tier in the admin."))
        for model in (TierLimit, ApiKeyLimit, UserTierLimit):
            for row in model.objects.all():
                try:
                    row.clean()
                except ValidationError as exc:
                    messages.append(checks.Error(
                        f"{model._meta.verbose_name} {row.pk} ({row.name}): {_problem(exc)}", id="ratelimit.E031",
                        hint="Requests of that tier follow the fail mode until it is fixed in the admin."))
        for rule in ClientRule.objects.select_related("api_key"):
            try:
                rule.clean()
            except ValidationError as exc:
                messages.append(checks.Error(f"client rule {rule.pk}: {_problem(exc)}", id="ratelimit.E032",
                                             hint="The rule is ignored until it is fixed in the admin."))
    except DatabaseError:  # not migrated yet: `migrate` comes first
        return []
    return messages
