"""`make_api_key`: an API key of a tier in one call, for tests (the database must be usable: pytest-django's
`db` fixture or `django_db` mark, or a Django TestCase)."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def make_api_key(tier: str = "free", *, name: str = "test key", owner: Any = None,
                 expires: datetime | None = None) -> str:
    """Create an API key of the tier whose slug is `tier` and return the full key, ready for the
    X-API-Key header. `owner` (a user) and `expires` (an aware datetime) are the key's own. Raises
    LookupError naming the tiers that exist when there is no such tier (`migrate` seeds free, pro and
    enterprise)."""
    from ..models import ApiKey, Tier

    found = Tier.objects.filter(slug=tier).first()
    if found is None:
        known = ", ".join(Tier.objects.order_by("slug").values_list("slug", flat=True)) or "none (run migrate)"
        raise LookupError(f"tier: no tier {tier!r}; the tiers are: {known}")
    _, key = ApiKey.objects.create_key(name=name, tier=found, owner=owner, expires=expires)
    return key
