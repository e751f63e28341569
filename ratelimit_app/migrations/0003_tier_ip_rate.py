"""A tier's own per-IP limit (Tier.ip_rate), and its value for the seeded tiers.

Each seeded tier lets one address send five keys' worth of its per-minute limit: free stays at the
100 a minute RATELIMIT['IP_RATE'] gives by default, and a pro or enterprise key is never refused by the
per-IP limit before its own limits (docs/plans.md, "The per-IP limit"). A request of a seeded tier is
still one EVALSHA: the per-IP limit is decided with the key's limits.

`seed_ip_rates` is idempotent and re-usable: tests call it (after `0002_seed_tiers.seed_tiers`) to
restore the seeded values.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

#: slug -> the per-IP rate of the seeded tier
SEED_IP_RATES = {"free": "100/m", "pro": "1000/m", "enterprise": "10000/m"}


def seed_ip_rates(apps: Any, schema_editor: Any = None) -> None:
    """Give the seeded tiers that exist their per-IP rate."""
    tier_model = apps.get_model("ratelimit_app", "Tier")
    for tier in tier_model.objects.filter(slug__in=SEED_IP_RATES):
        tier.ip_rate = SEED_IP_RATES[tier.slug]
        tier.save(update_fields=["ip_rate"])


class Migration(migrations.Migration):
    dependencies = [("ratelimit_app", "0002_seed_tiers")]

    operations = [
        migrations.AddField(
            model_name="tier",
            name="ip_rate",
            field=models.CharField(
                blank=True, default="", max_length=20, verbose_name="per-IP rate",
                help_text="What one client address may send under this tier, its keys and users together, such "
                          "as 1000/m (docs/plans.md). Empty: RATELIMIT['IP_RATE'], counted with requests without "
                          "a key.",
            ),
        ),
        migrations.RunPython(seed_ip_rates, migrations.RunPython.noop),
    ]
