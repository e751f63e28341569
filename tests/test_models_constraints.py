"""The check constraints of ratelimit_app.models: the database refuses what the plan models cannot mean,
whoever writes the row (`QuerySet.update`, raw SQL): on PostgreSQL and on SQLite (the suite runs on either,
with DATABASE_URL), and it accepts every row the admin can save. An algorithm is the registry's business,
not the schema's (a new one needs no migration): tests/plans/test_checks.py and test_compile.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction

from ratelimit_app.core.policies import MAX_LIMIT, MAX_PERIOD_SECONDS
from ratelimit_app.models import ApiKey, ApiKeyLimit, ClientRule, Tier, TierLimit, UserTier, UserTierLimit
from tests.support.limits_support import make_tier

pytestmark = pytest.mark.django_db


def _rows() -> dict[str, Any]:
    """One valid row of each plan model, saved as the admin would."""
    tier = make_tier("t", [("burst", "token_bucket", 20, 60, 10, "")])
    api_key, _ = ApiKey.objects.create_key(name="acme", tier=tier)
    user = get_user_model().objects.create(username="ann")
    user_tier = UserTier.objects.create(user=user, tier=tier)
    shape = {"name": "minute", "algorithm": "token_bucket", "limit": 5, "period": 60, "burst": 3}
    return {
        "tier": tier,
        "tierlimit": tier.limits.get(),
        "apikeylimit": ApiKeyLimit.objects.create(api_key=api_key, **shape),
        "usertierlimit": UserTierLimit.objects.create(user_tier=user_tier, **shape),
        "clientrule": ClientRule.objects.create(action="deny", network="10.0.0.0/8"),
        "api_key": api_key,
    }


@pytest.mark.parametrize(("model", "values"), [
    ("tier", {"fail_mode": "Closed"}),
    ("tier", {"fail_mode": "closed "}),
    ("tier", {"fail_mode": "bogus"}),
    ("tier", {"slug": "evil\r\nX-Injected: 1"}),
    ("tier", {"slug": "a.b"}),
    ("tier", {"slug": ""}),
    ("tierlimit", {"limit": 0}),
    ("tierlimit", {"limit": MAX_LIMIT + 1}),
    ("tierlimit", {"period": 0}),
    ("tierlimit", {"period": MAX_PERIOD_SECONDS + 1}),
    ("tierlimit", {"burst": 0}),
    ("tierlimit", {"burst": MAX_LIMIT + 1}),
    ("tierlimit", {"calendar": "year", "algorithm": "fixed_window", "burst": None}),
    ("tierlimit", {"calendar": "month"}),  # a calendar quota counts with fixed_window only
    ("tierlimit", {"name": "z.burst"}),
    ("tierlimit", {"name": ""}),
    ("tierlimit", {"scope": "a.b"}),
    ("apikeylimit", {"calendar": "week"}),
    ("apikeylimit", {"name": "z.burst"}),
    ("apikeylimit", {"period": 0}),
    ("usertierlimit", {"scope": "has space"}),
    ("clientrule", {"action": "DENY"}),
    ("clientrule", {"action": ""}),
    ("clientrule", {"network": ""}),  # neither a network nor a key
])
def test_the_database_refuses_rows_the_models_cannot_mean(model: str, values: dict[str, Any]) -> None:
    row = _rows()[model]
    with pytest.raises(IntegrityError), transaction.atomic():
        type(row).objects.filter(pk=row.pk).update(**values)


def test_a_client_rule_naming_both_a_network_and_a_key_is_refused_by_the_database() -> None:
    rows = _rows()
    with pytest.raises(IntegrityError), transaction.atomic():
        ClientRule.objects.filter(pk=rows["clientrule"].pk).update(api_key=rows["api_key"])


@pytest.mark.parametrize(("table", "column", "value"), [
    ("ratelimit_app_tier", "fail_mode", "Closed"),
    ("ratelimit_app_tier", "slug", "a\r\nb"),
    ("ratelimit_app_tierlimit", "name", "z.burst"),
    ("ratelimit_app_clientrule", "action", "DENY"),
])
def test_raw_sql_cannot_store_what_the_models_cannot_mean(table: str, column: str, value: str) -> None:
    rows = _rows()
    pk = {"ratelimit_app_tier": rows["tier"], "ratelimit_app_tierlimit": rows["tierlimit"],
          "ratelimit_app_clientrule": rows["clientrule"]}[table].pk
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE id = %s", [value, pk])  # noqa: S608


def test_every_row_the_admin_accepts_is_accepted_by_the_database() -> None:
    rows = _rows()
    TierLimit.objects.filter(pk=rows["tierlimit"].pk).update(
        name="day", algorithm="fixed_window", burst=None, calendar="day", period=86400, scope="write-1")
    Tier.objects.filter(pk=rows["tier"].pk).update(fail_mode="local", slug="Pro_2-x")
    ClientRule.objects.filter(pk=rows["clientrule"].pk).update(action="allow", network="", api_key=rows["api_key"])
