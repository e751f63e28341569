"""Seed the three standard tiers: free, pro and enterprise, each a burst, a per-minute and a per-day limit.

No concurrency limit: a request of a tier with one costs a second Redis round trip (its slot is given back
with a ZREM after the response), so staff add one per tier in the admin where it is worth that
(docs/protection.md). A request of a seeded tier is one EVALSHA.

`seed_tiers` is idempotent (update_or_create) and re-usable: tests call it to restore the seeded values.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

#: slug -> (name, [(limit name, algorithm, limit, period seconds, burst)])
SEED_TIERS: dict[str, tuple[str, list[tuple[str, str, int, int, int | None]]]] = {
    "free": ("Free", [
        ("burst", "token_bucket", 20, 60, 10),  # a bucket of 10, refilling 20 per minute
        ("minute", "sliding_window", 20, 60, None),
        ("day", "fixed_window", 1_000, 86_400, None),
    ]),
    "pro": ("Pro", [
        ("burst", "token_bucket", 200, 60, 50),
        ("minute", "sliding_window", 200, 60, None),
        ("day", "fixed_window", 50_000, 86_400, None),
    ]),
    "enterprise": ("Enterprise", [
        ("burst", "token_bucket", 2_000, 60, 200),
        ("minute", "sliding_window", 2_000, 60, None),
        ("day", "fixed_window", 1_000_000, 86_400, None),
    ]),
}


def seed_tiers(apps: Any, schema_editor: Any = None) -> None:
    """Create (or restore) the seeded tiers and their unscoped limits."""
    tier_model = apps.get_model("ratelimit_app", "Tier")
    limit_model = apps.get_model("ratelimit_app", "TierLimit")
    for slug, (name, limits) in SEED_TIERS.items():
        tier, _ = tier_model.objects.update_or_create(slug=slug, defaults={"name": name})
        for limit_name, algorithm, limit, period, burst in limits:
            limit_model.objects.update_or_create(
                tier=tier, scope="", name=limit_name,
                defaults={"algorithm": algorithm, "limit": limit, "period": period, "burst": burst, "enabled": True},
            )


def unseed_tiers(apps: Any, schema_editor: Any) -> None:
    """Remove the seeded tiers that no API key or user uses."""
    tier_model = apps.get_model("ratelimit_app", "Tier")
    tier_model.objects.filter(slug__in=SEED_TIERS, api_keys__isnull=True, users__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [("ratelimit_app", "0001_initial")]

    operations = [migrations.RunPython(seed_tiers, unseed_tiers)]
