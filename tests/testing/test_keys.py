"""make_api_key: a working key of a tier in one call; a clear error for a tier that does not exist."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from ratelimit_app.core.apikeys import parse_key
from ratelimit_app.models import ApiKey
from ratelimit_app.testing import IsolatedRateLimit, assert_not_limited, make_api_key

pytestmark = pytest.mark.django_db


def test_a_key_of_a_tier_in_one_call(client: Client, ratelimit: IsolatedRateLimit) -> None:
    key = make_api_key("pro", name="partner", expires=timezone.now() + timedelta(days=1))
    stored = ApiKey.objects.get(prefix=parse_key(key))
    assert (stored.tier.slug, stored.name) == ("pro", "partner") and stored.expires is not None
    response = client.get("/api/users", HTTP_X_API_KEY=key)
    assert_not_limited(response)
    assert response["X-RateLimit-Tier"] == "pro"
    assert make_api_key() != key and ApiKey.objects.get(prefix=parse_key(make_api_key())).tier.slug == "free"


def test_an_unknown_tier_names_the_tiers_that_exist() -> None:
    with pytest.raises(LookupError, match="no tier 'gold'; the tiers are: enterprise, free, pro"):
        make_api_key("gold")
