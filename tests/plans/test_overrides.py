"""Per-key and per-user limit overrides, edited in the admin: a limit named like a tier limit replaces it
for that client only, another name adds one; the key's page, `ratelimit_status` and the status
endpoint show the effective set."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from ratelimit_app.core.policies import Policy
from ratelimit_app.models import ApiKey, ApiKeyLimit, Tier, UserTier
from ratelimit_app.plans.compile import TierInfo, apply_overrides
from tests.support.limits_support import LimitSpec, make_key, make_tier
from tests.test_admin import form_data

pytestmark = pytest.mark.django_db

#: a tier whose minute limit is the one that bites (no burst limit in the way)
LIMITS: list[LimitSpec] = [("minute", "sliding_window", 3, 60, None, ""),
                           ("day", "fixed_window", 1000, 86400, None, "")]


def add_override(admin_client: Client, url: str, **fields: Any) -> Any:
    """Add one inline override row on an admin change page and save, as staff would."""
    page = admin_client.get(url)
    data = form_data(page)
    formset = page.context["inline_admin_formsets"][0].formset
    n = int(data[f"{formset.prefix}-TOTAL_FORMS"])
    data[f"{formset.prefix}-TOTAL_FORMS"] = str(n + 1)
    row = {"scope": "", "burst": "", "enabled": "on", **fields}
    data.update({f"{formset.prefix}-{n}-{name}": value for name, value in row.items() if value is not False})
    return admin_client.post(url, data)


def test_an_override_raises_one_keys_minute_limit_and_not_anothers(admin_client: Client, client: Client,
                                                                   settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": None}
    make_tier("basic", LIMITS)
    raised, plain = make_key("basic", name="big customer"), make_key("basic", name="small customer")
    assert [client.get("/api/users", HTTP_X_API_KEY=raised).status_code for _ in range(1)] == [200]  # cached
    api_key = ApiKey.objects.get(prefix=raised.partition(".")[0])
    url = reverse("admin:ratelimit_app_apikey_change", args=[api_key.pk])
    saved = add_override(admin_client, url, name="minute", algorithm="sliding_window", limit="6", period="60")
    assert saved.status_code == 302, saved.context and saved.context["adminform"].form.errors
    assert ApiKeyLimit.objects.get(api_key=api_key).limit == 6

    # the raised key gets 6 a minute (1 already used), the other key of the same tier stays at 3
    assert [client.get("/api/users", HTTP_X_API_KEY=raised).status_code for _ in range(6)] == [200] * 5 + [429]
    assert [client.get("/api/users", HTTP_X_API_KEY=plain).status_code for _ in range(4)] == [200] * 3 + [429]
    assert client.get("/api/users", HTTP_X_API_KEY=raised)["RateLimit-Policy"] == \
        '"minute";q=6;w=60, "day";q=1000;w=86400'

    # the key's page shows its effective limits, marking the override
    page = admin_client.get(url).content.decode()
    table = page.split('class="rl-effective-limits"')[1].split("</table>")[0]
    assert "<td>minute</td><td>6/m</td><td>sliding_window</td><td>enforced</td><td>override</td>" in table
    assert "<td>day</td><td>1000/d</td><td>fixed_window</td><td>enforced</td><td>tier basic</td>" in table

    # so do ratelimit_status and the status endpoint
    out = StringIO()
    call_command("ratelimit_status", api_key.prefix, stdout=out)
    minute_row = next(line for line in out.getvalue().splitlines() if " minute " in line).split()
    assert minute_row[:5] == [f"key:{api_key.prefix}", "minute", "sliding_window", "6/m", "0/6"]
    status = client.get("/api/rate-limit/status", HTTP_X_API_KEY=raised).json()
    assert [(item["name"], item["limit"], item["remaining"]) for item in status["limits"]] == [
        ("minute", 6, 0), ("day", 1000, 994)]


def test_an_override_with_a_new_name_adds_a_limit_and_a_disabled_one_removes_the_tier_limit(
        admin_client: Client, client: Client, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": None}
    make_tier("basic", LIMITS)
    key = make_key("basic")
    api_key = ApiKey.objects.get(prefix=key.partition(".")[0])
    url = reverse("admin:ratelimit_app_apikey_change", args=[api_key.pk])
    assert add_override(admin_client, url, name="minute", algorithm="sliding_window", limit="3", period="60",
                        enabled=False).status_code == 302
    assert add_override(admin_client, url, name="second", algorithm="fixed_window", limit="4",
                        period="3600").status_code == 302
    response = client.get("/api/users", HTTP_X_API_KEY=key)
    assert response["RateLimit-Policy"] == '"day";q=1000;w=86400, "second";q=4;w=3600'
    assert [client.get("/api/users", HTTP_X_API_KEY=key).status_code for _ in range(4)] == [200] * 3 + [429]


def test_an_invalid_override_is_refused_by_the_admin_form(admin_client: Client) -> None:
    make_tier("basic", LIMITS)
    key = make_key("basic")
    api_key = ApiKey.objects.get(prefix=key.partition(".")[0])
    url = reverse("admin:ratelimit_app_apikey_change", args=[api_key.pk])
    refused = add_override(admin_client, url, name="minute", algorithm="fixed_window", limit="3", period="60",
                           burst="5")
    assert refused.status_code == 200
    assert "take a burst" in str(refused.context["inline_admin_formsets"][0].formset.errors)
    assert not ApiKeyLimit.objects.exists()


def test_a_user_override_applies_to_that_user_only(admin_client: Client, client: Client, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": None}
    tier = make_tier("basic", LIMITS)
    users = get_user_model().objects
    alice, bob = users.create_user("alice", password="pw"), users.create_user("bob", password="pw")
    alice_tier = UserTier.objects.create(user=alice, tier=tier)
    UserTier.objects.create(user=bob, tier=tier)
    url = reverse("admin:ratelimit_app_usertier_change", args=[alice_tier.pk])
    saved = add_override(admin_client, url, name="minute", algorithm="sliding_window", limit="5", period="60")
    assert saved.status_code == 302, saved.context and saved.context["adminform"].form.errors
    alice_client, bob_client = Client(), Client()
    alice_client.force_login(alice)
    bob_client.force_login(bob)
    assert [alice_client.get("/api/users").status_code for _ in range(6)] == [200] * 5 + [429]
    assert [bob_client.get("/api/users").status_code for _ in range(4)] == [200] * 3 + [429]
    out = StringIO()
    call_command("ratelimit_status", f"user:{alice.pk}", stdout=out)
    assert "5/m" in out.getvalue()
    assert "override" in admin_client.get(url).content.decode()


def test_warm_requests_with_overrides_make_no_database_query(client: Client, settings: Any,
                                                             django_assert_num_queries: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_RATE": None}
    make_tier("basic", LIMITS)
    key = make_key("basic")
    ApiKeyLimit.objects.create(api_key=ApiKey.objects.get(), name="minute", algorithm="sliding_window", limit=9,
                               period=60)
    assert client.get("/api/users", HTTP_X_API_KEY=key)["X-RateLimit-Limit"] == "9"
    with django_assert_num_queries(0):
        assert client.get("/api/users", HTTP_X_API_KEY=key)["X-RateLimit-Limit"] == "9"
    # a tier edit reaches the merged limits too (the merge is cached per tier object)
    Tier.objects.get(slug="basic").limits.filter(name="day").update(limit=500)
    Tier.objects.get(slug="basic").save()  # the signal invalidates the caches
    assert '"day";q=500' in client.get("/api/users", HTTP_X_API_KEY=key)["RateLimit-Policy"]


def test_apply_overrides_keeps_scoped_limits_and_order() -> None:
    minute = Policy("minute", "sliding_window", limit=3, period=60)
    day = Policy("day", "fixed_window", limit=1000, period=86400)
    search = Policy("search.minute", "sliding_window", limit=2, period=60)
    tier = TierInfo("basic", "Basic", None, (minute, day), {"search": (minute, day, search)})
    merged = apply_overrides(tier, (("minute", "gcra", 6, 60, 2, "", True, False),
                                    ("minute", "sliding_window", 1, 60, None, "search", True, True)))
    assert [p.name for p in merged.policies] == ["minute", "day"]
    assert merged.policies[0] == Policy("minute", "gcra", limit=6, period=60, burst=2)
    assert merged.policies_for("search")[2] == Policy("search.minute", "sliding_window", limit=1, period=60,
                                                      shadow=True)
