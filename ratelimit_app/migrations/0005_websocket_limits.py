"""WebSocket limits for the seeded tiers (docs/websockets.md): per connect ("websocket" scope: connects per
minute and connections held at once, each connection's slot a lease renewed while it lives) and per
message ("websocket_message" scope).

Each stays under its tier's per-IP rate (0003), as `manage.py check` asks (W030). No unscoped limit changes:
HTTP requests of a seeded tier still cost one Redis call, without a slot.

`seed_websocket_limits` is idempotent (update_or_create) and leaves tiers that do not exist alone.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

#: slug -> [(scope, limit name, algorithm, limit, period seconds)]; a concurrency limit's period is its lease.
WEBSOCKET_LIMITS: dict[str, list[tuple[str, str, str, int, int]]] = {
    "free": [
        ("websocket", "connects", "sliding_window", 5, 60),
        ("websocket", "connections", "concurrency", 2, 15),
        ("websocket_message", "messages", "sliding_window", 10, 10),
    ],
    "pro": [
        ("websocket", "connects", "sliding_window", 60, 60),
        ("websocket", "connections", "concurrency", 20, 15),
        ("websocket_message", "messages", "sliding_window", 100, 10),
    ],
    "enterprise": [
        ("websocket", "connects", "sliding_window", 600, 60),
        ("websocket", "connections", "concurrency", 200, 15),
        ("websocket_message", "messages", "sliding_window", 1_000, 10),
    ],
}


def seed_websocket_limits(apps: Any, schema_editor: Any = None) -> None:
    """Create (or restore) the WebSocket limits of the seeded tiers that exist."""
    tier_model = apps.get_model("ratelimit_app", "Tier")
    limit_model = apps.get_model("ratelimit_app", "TierLimit")
    for tier in tier_model.objects.filter(slug__in=WEBSOCKET_LIMITS):
        for scope, name, algorithm, limit, period in WEBSOCKET_LIMITS[tier.slug]:
            limit_model.objects.update_or_create(
                tier=tier, scope=scope, name=name,
                defaults={"algorithm": algorithm, "limit": limit, "period": period, "burst": None, "enabled": True},
            )


def unseed_websocket_limits(apps: Any, schema_editor: Any) -> None:
    """Remove the seeded WebSocket limits."""
    limit_model = apps.get_model("ratelimit_app", "TierLimit")
    for slug, limits in WEBSOCKET_LIMITS.items():
        for scope, name, *_ in limits:
            limit_model.objects.filter(tier__slug=slug, scope=scope, name=name).delete()


class Migration(migrations.Migration):
    dependencies = [("ratelimit_app", "0004_usage_units")]

    operations = [migrations.RunPython(seed_websocket_limits, unseed_websocket_limits)]
