"""A tier limit may not be named like the per-IP policy ("ip", unscoped): a database constraint.

Rows that already break the rule (written around the admin form, which always refused them) are renamed
`ip-tier-<id>` first: they shared their Redis keys with the per-IP limit.
"""

from __future__ import annotations

from typing import Any

import django
from django.db import migrations, models

# CheckConstraint's `check` argument is named `condition` from Django 5.1 on
_CONDITION = "condition" if django.VERSION >= (5, 1) else "check"


def rename_reserved(apps: Any, schema_editor: Any) -> None:
    TierLimit = apps.get_model("ratelimit_app", "TierLimit")
    for limit in TierLimit.objects.using(schema_editor.connection.alias).filter(name="ip", scope=""):
        limit.name = f"ip-tier-{limit.pk}"
        limit.save(update_fields=["name"])


class Migration(migrations.Migration):
    dependencies = [
        ("ratelimit_app", "0002_seed_tiers"),
    ]

    operations = [
        migrations.RunPython(rename_reserved, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="tierlimit",
            constraint=models.CheckConstraint(
                **{_CONDITION: ~models.Q(name="ip", scope="")}, name="ratelimit_limit_name_not_ip",
                violation_error_message="'ip' is reserved for the per-IP limit.",
            ),
        ),
    ]
