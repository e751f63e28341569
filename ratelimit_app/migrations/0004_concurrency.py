"""The concurrency algorithm (requests in flight) becomes a TierLimit choice, and the seeded tiers get a
concurrency limit: free 2, pro 10, enterprise 50 requests in flight, each slot a 60-second lease.

`seed_concurrency` is idempotent (update_or_create) and re-usable: tests call it to restore the seed.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

#: limit name, lease seconds, and slots per seeded tier
CONCURRENCY_NAME = "concurrency"
LEASE_SECONDS = 60
SEED_SLOTS = {"free": 2, "pro": 10, "enterprise": 50}


def seed_concurrency(apps: Any, schema_editor: Any = None) -> None:
    """Give each seeded tier that exists its concurrency limit (restored to the seeded values)."""
    tier_model = apps.get_model("ratelimit_app", "Tier")
    limit_model = apps.get_model("ratelimit_app", "TierLimit")
    for tier in tier_model.objects.filter(slug__in=SEED_SLOTS):
        limit_model.objects.update_or_create(
            tier=tier, scope="", name=CONCURRENCY_NAME,
            defaults={"algorithm": "concurrency", "limit": SEED_SLOTS[tier.slug], "period": LEASE_SECONDS,
                      "burst": None, "enabled": True},
        )


def unseed_concurrency(apps: Any, schema_editor: Any) -> None:
    """Remove the seeded concurrency limits (the algorithm choice goes away with this migration)."""
    limit_model = apps.get_model("ratelimit_app", "TierLimit")
    limit_model.objects.filter(tier__slug__in=SEED_SLOTS, scope="", name=CONCURRENCY_NAME,
                               algorithm="concurrency").delete()


class Migration(migrations.Migration):
    dependencies = [("ratelimit_app", "0003_limit_name_not_ip")]

    operations = [
        migrations.AlterField(
            model_name="tierlimit",
            name="algorithm",
            field=models.CharField(
                choices=[("fixed_window", "fixed window"), ("sliding_window", "sliding window"),
                         ("sliding_window_counter", "sliding window counter"), ("token_bucket", "token bucket"),
                         ("gcra", "gcra"), ("concurrency", "concurrency")],
                max_length=30,
            ),
        ),
        migrations.RunPython(seed_concurrency, unseed_concurrency),
    ]
