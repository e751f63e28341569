"""Models: the seeded tiers, limit validation, keys stored hashed, one-way revocation, complete migrations."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ratelimit_app import Policy
from ratelimit_app.core.apikeys import hash_key
from ratelimit_app.core.calendars import CALENDAR_PERIODS
from ratelimit_app.models import ApiKey, ApiKeyLimit, Tier, TierLimit
from ratelimit_app.plans.compile import apply_overrides
from ratelimit_app.plans.lookups import get_lookups, invalidate
from tests.support.limits_support import make_tier, seed_tiers

pytestmark = pytest.mark.django_db


def limits_of(slug: str) -> list[tuple[str, str, int, int, int | None, str, bool]]:
    """The HTTP limits of tier `slug` (its WebSocket scopes aside: tests/channels)."""
    return list(TierLimit.objects.filter(tier__slug=slug).exclude(scope__startswith="websocket")
                .order_by("period", "id")
                .values_list("name", "algorithm", "limit", "period", "burst", "scope", "enabled"))


def test_migration_seeds_free_pro_and_enterprise() -> None:
    seed_tiers()  # idempotent: restores the seed if a transactional test flushed it
    assert set(Tier.objects.values_list("slug", flat=True)) >= {"free", "pro", "enterprise"}
    assert limits_of("free") == [
        ("burst", "token_bucket", 20, 60, 10, "", True),
        ("minute", "sliding_window", 20, 60, None, "", True),
        ("day", "fixed_window", 1_000, 86_400, None, "", True),
    ]
    assert [(n, lim, b) for n, _, lim, _, b, scope, _ in limits_of("pro") if not scope] == [
        ("burst", 200, 50), ("minute", 200, None), ("day", 50_000, None)]
    # and a usage limit, for the routes of the scope "llm" only (the demo's chat endpoint)
    assert [(t.policy_name, t.unit, t.limit, t.period, t.algorithm) for t in TierLimit.objects.filter(
        tier__slug="pro", scope="llm")] == [("llm.tokens", "tokens", 2_000, 60, "sliding_window")]
    assert [(n, lim, b) for n, _, lim, _, b, _, _ in limits_of("enterprise")] == [
        ("burst", 2_000, 200), ("minute", 2_000, None), ("day", 1_000_000, None)]
    # no concurrency limit: a slot costs a second round trip per request (docs/protection.md)
    assert not TierLimit.objects.filter(tier__slug__in=["free", "pro", "enterprise"], algorithm="concurrency",
                                        scope="").exists()


def test_seeded_free_tier_is_the_documented_policy_set() -> None:
    seed_tiers()
    policies = [limit.to_policy() for limit in TierLimit.objects.filter(tier__slug="free", scope="")
                .order_by("period", "id")]
    assert policies == [
        Policy("burst", "token_bucket", limit=20, period=60, burst=10),
        Policy("minute", "sliding_window", limit=20, period=60),
        Policy("day", "fixed_window", limit=1000, period=86400),
    ]


@pytest.mark.parametrize(("fields", "field_at_fault"), [
    ({"algorithm": "sliding_window", "burst": 5}, "burst"),
    ({"name": "ip"}, "name"),
    ({"name": "has space"}, "name"),
    ({"limit": 0}, "limit"),
    ({"period": 0}, "period"),
    ({"period": 400 * 86400}, "period"),
    ({"algorithm": "leaky"}, "algorithm"),
    ({"scope": "bad scope"}, "scope"),
])
def test_invalid_limits_are_refused_naming_the_field(fields: dict[str, object], field_at_fault: str) -> None:
    tier = Tier.objects.create(slug="t", name="T")
    values: dict[str, object] = {"name": "minute", "algorithm": "token_bucket", "limit": 20, "period": 60}
    values.update(fields)
    limit = TierLimit(tier=tier, **values)
    with pytest.raises(ValidationError) as excinfo:
        limit.full_clean()
    assert field_at_fault in excinfo.value.message_dict


def test_scoped_limit_becomes_a_policy_named_scope_dot_name() -> None:
    tier = make_tier("t", [("minute", "sliding_window", 5, 60, None, "write"), ("ip", "gcra", 1, 1, 2, "x")])
    names = sorted(limit.to_policy().name for limit in tier.limits.all())
    assert names == ["write.minute", "x.ip"]


def test_limit_names_are_unique_per_tier_and_scope() -> None:
    make_tier("t", [("minute", "sliding_window", 5, 60, None, ""), ("minute", "sliding_window", 2, 60, None, "w")])
    duplicate = TierLimit(tier=Tier.objects.get(slug="t"), name="minute", algorithm="gcra", limit=1, period=1)
    with pytest.raises(ValidationError):
        duplicate.full_clean()


def test_a_limit_named_like_the_per_ip_policy_is_refused_by_the_database() -> None:
    tier = Tier.objects.create(slug="t", name="T")
    with pytest.raises(IntegrityError, match="ratelimit_limit_name_not_ip|CHECK constraint"), transaction.atomic():
        TierLimit.objects.create(tier=tier, name="ip", algorithm="gcra", limit=5, period=60)  # no full_clean
    assert not TierLimit.objects.filter(tier=tier).exists()
    TierLimit.objects.create(tier=tier, name="ip", algorithm="gcra", limit=5, period=60, scope="upload")  # scoped: ok
    # the form reports it once, on the field, not again as a constraint violation
    with pytest.raises(ValidationError) as excinfo:
        TierLimit(tier=tier, name="ip", algorithm="gcra", limit=5, period=60).full_clean()
    assert excinfo.value.message_dict == {"name": ["'ip' is reserved for the per-IP limit."]}


def test_key_is_stored_as_prefix_and_hash_only() -> None:
    seed_tiers()
    api_key, key = ApiKey.objects.create_key(name="acme", tier=Tier.objects.get(slug="free"))
    prefix, secret = key.split(".")
    assert api_key.prefix == prefix and api_key.hashed_key == hash_key(key)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM ratelimit_app_apikey WHERE id = %s", [api_key.pk])
        row = cursor.fetchone()
    assert row is not None
    assert not any(isinstance(value, str) and secret in value for value in row)
    assert "acme" in str(api_key) and secret not in str(api_key)


def test_revocation_cannot_be_undone() -> None:
    seed_tiers()
    api_key, _ = ApiKey.objects.create_key(name="acme", tier=Tier.objects.get(slug="free"))
    api_key.revoked = True
    api_key.save()
    restored = ApiKey.objects.get(pk=api_key.pk)
    restored.revoked = False
    with pytest.raises(ValidationError, match="cannot be restored"):
        restored.full_clean()
    with pytest.raises(ValidationError, match="cannot be restored"):
        restored.save()
    assert ApiKey.objects.get(pk=api_key.pk).revoked


def test_keys_cannot_be_saved_without_a_hash() -> None:
    seed_tiers()
    with pytest.raises(ValidationError, match="create_key"):
        ApiKey(name="x", tier=Tier.objects.get(slug="free")).save()


def test_expiry() -> None:
    seed_tiers()
    free = Tier.objects.get(slug="free")
    past, _ = ApiKey.objects.create_key(name="a", tier=free, expires=timezone.now() - timedelta(seconds=1))
    future, _ = ApiKey.objects.create_key(name="b", tier=free, expires=timezone.now() + timedelta(days=1))
    never, _ = ApiKey.objects.create_key(name="c", tier=free)
    assert (past.is_expired, future.is_expired, never.is_expired) == (True, False, False)


def test_a_tier_in_use_cannot_be_deleted() -> None:
    seed_tiers()
    free = Tier.objects.get(slug="free")
    ApiKey.objects.create_key(name="a", tier=free)
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError):
        free.delete()


def test_migrations_are_complete_and_the_demo_passes_check() -> None:
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()
    call_command("check", stdout=out)


def _rows() -> dict[str, Any]:
    """A tier with a limit and an API key with an override, saved as the admin would (what the database
    refuses in such rows: tests/plans/test_constraints.py)."""
    tier = make_tier("t", [("burst", "token_bucket", 20, 60, 10, "")])
    api_key, _ = ApiKey.objects.create_key(name="acme", tier=tier)
    shape = {"name": "minute", "algorithm": "token_bucket", "limit": 5, "period": 60, "burst": 3}
    return {"tier": tier, "tierlimit": tier.limits.get(), "apikeylimit": ApiKeyLimit.objects.create(
        api_key=api_key, **shape), "api_key": api_key}


@pytest.mark.parametrize(("calendar", "stored_period"), [("month", 2_592_000), ("day", 3_600), ("week", 1)])
def test_a_calendar_quotas_period_is_derived_from_its_calendar_not_read_from_the_row(
        calendar: str, stored_period: int) -> None:
    rows = _rows()
    TierLimit.objects.filter(pk=rows["tierlimit"].pk).update(
        name=calendar, algorithm="fixed_window", burst=None, calendar=calendar, period=stored_period)
    ApiKeyLimit.objects.filter(pk=rows["apikeylimit"].pk).update(
        name=calendar, algorithm="fixed_window", burst=None, calendar=calendar, period=stored_period)
    invalidate()  # update() bypasses the signals
    expected = CALENDAR_PERIODS[calendar]
    assert TierLimit.objects.get(pk=rows["tierlimit"].pk).to_policy().period == expected
    assert ApiKeyLimit.objects.get(pk=rows["apikeylimit"].pk).to_policy().period == expected
    tier = get_lookups().tier("t")
    assert tier is not None and [(p.name, p.period) for p in tier.policies] == [(calendar, expected)]
    key = get_lookups().key(rows["api_key"].prefix)
    assert key is not None
    merged = apply_overrides(tier, key.overrides)
    assert [(p.name, p.period) for p in merged.policies] == [(calendar, expected)]
