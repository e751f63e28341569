"""The shop's plans: its own tier, 'metered' (3 requests per calendar month, Paris time), and two downloads
at once for the free tier (a concurrency limit: the seeded tiers have none)."""

from typing import Any

from django.db import migrations


def create_plans(apps: Any, schema_editor: Any) -> None:
    Tier = apps.get_model("ratelimit_app", "Tier")
    TierLimit = apps.get_model("ratelimit_app", "TierLimit")
    tier = Tier.objects.create(slug="metered", name="Metered", time_zone="Europe/Paris")
    TierLimit.objects.create(tier=tier, name="month", algorithm="fixed_window", limit=3, period=31 * 86400,
                             calendar="month")
    TierLimit.objects.create(tier=Tier.objects.get(slug="free"), name="downloads", algorithm="concurrency", limit=2,
                             period=60)


class Migration(migrations.Migration):
    dependencies = [("ratelimit_app", "0001_initial")]
    operations = [migrations.RunPython(create_plans, migrations.RunPython.noop)]
