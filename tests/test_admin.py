"""The admin as staff use it (Django test client posting the real forms): tier edits reach enforcement,
revoked keys are refused, a new key is shown exactly once, revocation cannot be undone."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from ratelimit_app.core.apikeys import hash_key
from ratelimit_app.models import ApiKey, ApiKeyLimit, Tier, TierLimit
from ratelimit_app.plans.lookups import build_lookups
from tests.support.limits_support import make_key, poll, seed_tiers

pytestmark = pytest.mark.django_db

KEY_PATTERN = re.compile(r"[A-Za-z0-9]{8}\.[A-Za-z0-9_-]{43}")




def form_data(response: Any) -> dict[str, Any]:
    """The POST data a browser would send for an admin change page as rendered (main form + inlines)."""
    data: dict[str, Any] = {}

    def add(form: Any) -> None:
        for name in form.fields:
            value = form[name].value()
            if value is True:
                data[form.add_prefix(name)] = "on"
            elif value is not None and value is not False:  # a browser sends zeros (0 == False)
                data[form.add_prefix(name)] = value

    add(response.context["adminform"].form)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        add(formset.management_form)
        for form in formset.forms:
            add(form)
    return data


def api(client: Any, key: str) -> Any:
    return client.get("/api/users", HTTP_X_API_KEY=key)


def test_editing_a_tier_limit_in_the_admin_changes_enforcement(admin_client: Any, client: Any,
                                                               settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "CACHE_TTL": 1.0}
    seed_tiers()
    old_key = make_key("free")
    assert api(client, old_key)["X-RateLimit-Limit"] == "10"  # key and tier are now cached
    other_server = build_lookups()  # another app server, with its own warm cache
    assert other_server.tier("free").policies[0].capacity == 10  # type: ignore[union-attr]

    free = Tier.objects.get(slug="free")
    url = reverse("admin:ratelimit_app_tier_change", args=[free.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    data = form_data(page)
    burst_form = next(f for f in page.context["inline_admin_formsets"][0].formset.forms
                      if f.instance.name == "burst")
    assert data[burst_form.add_prefix("burst")] == 10
    data[burst_form.add_prefix("burst")] = "3"
    saved = admin_client.post(url, data)
    assert saved.status_code == 302, saved.context and saved.context["adminform"].form.errors
    assert TierLimit.objects.get(tier=free, name="burst").burst == 3

    # This server applies it at once (the save invalidated its cache) ...
    assert api(client, old_key)["X-RateLimit-Limit"] == "3"
    new_key = make_key("free")
    assert [api(client, new_key).status_code for _ in range(4)] == [200, 200, 200, 429]
    # ... and another server within CACHE_TTL (1 s here), without a restart.
    assert poll(lambda: other_server.tier("free").policies[0].capacity == 3, deadline=1.0 + 1.0)  # type: ignore[union-attr]


def test_invalid_limits_are_refused_by_the_admin_form(admin_client: Any) -> None:
    seed_tiers()
    free = Tier.objects.get(slug="free")
    url = reverse("admin:ratelimit_app_tier_change", args=[free.pk])
    page = admin_client.get(url)
    data = form_data(page)
    minute_form = next(f for f in page.context["inline_admin_formsets"][0].formset.forms
                       if f.instance.name == "minute")
    data[minute_form.add_prefix("burst")] = "5"  # sliding_window takes no burst
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "take a burst" in response.content.decode()
    assert TierLimit.objects.get(tier=free, name="minute").burst is None


def test_a_key_revoked_in_the_admin_is_refused(admin_client: Any, client: Any, settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "CACHE_TTL": 1.0}
    seed_tiers()
    key = make_key("free")
    prefix = key.split(".")[0]
    assert api(client, key).status_code == 200
    other_server = build_lookups()
    assert other_server.key(prefix).revoked is False  # type: ignore[union-attr]

    api_key = ApiKey.objects.get(prefix=prefix)
    url = reverse("admin:ratelimit_app_apikey_change", args=[api_key.pk])
    data = form_data(admin_client.get(url))
    data["revoked"] = "on"
    assert admin_client.post(url, data).status_code == 302

    response = api(client, key)
    assert response.status_code == 401 and response.json() == {"error": "API key revoked"}
    assert poll(lambda: other_server.key(prefix).revoked is True, deadline=1.0 + 1.0)  # type: ignore[union-attr]


def test_revoke_action_in_the_changelist(admin_client: Any, client: Any) -> None:
    seed_tiers()
    keys = [make_key("free") for _ in range(2)]
    assert all(api(client, key).status_code == 200 for key in keys)
    pks = list(ApiKey.objects.values_list("pk", flat=True))
    response = admin_client.post(reverse("admin:ratelimit_app_apikey_changelist"),
                                 {"action": "revoke_keys", "_selected_action": pks}, follow=True)
    assert "Revoked 2 API key(s)." in response.content.decode()
    assert [api(client, key).status_code for key in keys] == [401, 401]


def test_revocation_cannot_be_undone_in_the_admin(admin_client: Any) -> None:
    seed_tiers()
    key = make_key("free")
    api_key = ApiKey.objects.get(prefix=key.split(".")[0])
    api_key.revoked = True
    api_key.save()
    url = reverse("admin:ratelimit_app_apikey_change", args=[api_key.pk])
    page = admin_client.get(url)
    assert "revoked" not in page.context["adminform"].form.fields  # shown read-only
    data = form_data(page)
    data["revoked"] = ""  # a forged form cannot restore it either
    admin_client.post(url, data)
    assert ApiKey.objects.get(pk=api_key.pk).revoked


def test_a_new_key_is_shown_exactly_once(admin_client: Any, client: Any) -> None:
    seed_tiers()
    free = Tier.objects.get(slug="free")
    created = admin_client.post(reverse("admin:ratelimit_app_apikey_add"), {
        "name": "mobile app", "tier": free.pk, "owner": "", "expires_0": "", "expires_1": "",
    }, follow=True)
    assert created.status_code == 200
    shown = KEY_PATTERN.findall(created.content.decode())
    assert len(shown) == 1
    key = shown[0]
    api_key = ApiKey.objects.get(name="mobile app")
    assert key.startswith(api_key.prefix + ".") and api_key.hashed_key == hash_key(key)
    assert api(client, key).status_code == 200  # the key shown is the one that works

    secret = key.split(".")[1]
    for url in (reverse("admin:ratelimit_app_apikey_changelist"),
                reverse("admin:ratelimit_app_apikey_change", args=[api_key.pk]),
                reverse("admin:ratelimit_app_apikey_history", args=[api_key.pk]),
                reverse("admin:index")):
        page = admin_client.get(url).content.decode()
        assert secret not in page
        assert api_key.prefix in page or url == reverse("admin:index")
    assert not any(secret in entry.object_repr or secret in entry.change_message for entry in LogEntry.objects.all())


def test_only_staff_reach_the_admin(client: Any, django_user_model: Any) -> None:
    user = django_user_model.objects.create_user("bob", password="pw")
    client.force_login(user)
    response = client.get(reverse("admin:ratelimit_app_apikey_changelist"))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_admin_shows_a_stored_limit_that_is_not_enforced(admin_client: Any) -> None:
    from ratelimit_app.core.policies import MAX_LIMIT, MAX_PERIOD_SECONDS
    from ratelimit_app.models import ApiKeyLimit
    from tests.support.limits_support import make_tier

    tier = make_tier("t", [("minute", "sliding_window", 5, 60, None, ""), ("huge", "sliding_window", 5, 60, None, "")])
    TierLimit.objects.filter(tier=tier, name="huge").update(algorithm="token_bucket", limit=MAX_LIMIT,
                                                            period=MAX_PERIOD_SECONDS)
    changelist = admin_client.get(reverse("admin:ratelimit_app_tier_changelist")).content.decode()
    assert "huge: " in changelist and "not enforced" in changelist
    change = admin_client.get(reverse("admin:ratelimit_app_tier_change", args=[tier.pk])).content.decode()
    assert "not enforced: limit:" in change and "too large to count exactly" in change

    api_key, _ = ApiKey.objects.create_key(name="acme", tier=tier)
    ApiKeyLimit.objects.create(api_key=api_key, name="extra", algorithm="token_bucket", limit=5, period=60)
    ApiKeyLimit.objects.filter(api_key=api_key).update(limit=MAX_LIMIT, period=MAX_PERIOD_SECONDS)
    page = admin_client.get(reverse("admin:ratelimit_app_apikey_change", args=[api_key.pk])).content.decode()
    assert page.count("not enforced") == 1  # the override, in its inline row


@pytest.mark.parametrize(("name", "value", "shown"), [
    ("IP_RATE", "lots", "rl-effective-limits"),
    ("CACHE_TTL", 0, "RATELIMIT[&#x27;CACHE_TTL&#x27;] is invalid"),
])
def test_an_invalid_ratelimit_never_breaks_the_api_key_pages(admin_client: Any, settings: Any, name: str,
                                                             value: Any, shown: str) -> None:
    seed_tiers()
    make_key("free", name="acme")
    api_key = ApiKey.objects.get(name="acme")
    settings.RATELIMIT = {**settings.RATELIMIT, name: value}
    for url in (reverse("admin:ratelimit_app_apikey_changelist"), reverse("admin:ratelimit_app_tier_changelist")):
        assert admin_client.get(url).status_code == 200, url
    change = admin_client.get(reverse("admin:ratelimit_app_apikey_change", args=[api_key.pk]))
    assert change.status_code == 200 and shown in change.content.decode()


def test_the_key_list_says_whether_each_key_is_active_revoked_or_expired(admin_client: Any) -> None:
    seed_tiers()
    free = Tier.objects.get(slug="free")
    ApiKey.objects.create_key(name="live", tier=free)
    revoked, _ = ApiKey.objects.create_key(name="gone", tier=free)
    revoked.revoked = True
    revoked.save(update_fields=["revoked"])
    ApiKey.objects.create_key(name="old", tier=free, expires=timezone.now() - timedelta(days=1))
    page = admin_client.get(reverse("admin:ratelimit_app_apikey_changelist"))
    html = page.content.decode()
    columns = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert "status" in columns and "revoked" not in columns and ">Status</a>" in html
    rows = {name: status for name, status in
            re.findall(r'<a href="[^"]+/change/">([^<]+)</a></th>.*?<td class="field-status">([^<]+)</td>', html)}
    assert rows == {"live": "Active", "gone": "Revoked", "old": "Expired"}
    assert "icon-no.svg" not in html  # no red cross beside an active key


def effective_rows(page: Any) -> list[list[str]]:
    """The rows of the "effective limits" table of an admin page, each a list of its cells' text."""
    table = page.content.decode().split('class="rl-effective-limits"')[1].split("</tbody>")[0]
    return [re.findall(r"<td>(.*?)</td>", row) for row in table.split("<tr>")[2:]]


def test_the_effective_limits_of_a_tier_and_a_key_show_the_per_ip_limit(admin_client: Any) -> None:
    seed_tiers()
    enterprise = Tier.objects.get(slug="enterprise")
    page = admin_client.get(reverse("admin:ratelimit_app_tier_change", args=[enterprise.pk]))
    rows = {row[0]: row for row in effective_rows(page)}
    assert rows["minute"][1:3] == ["2000/m", "sliding_window"]
    assert rows["ip"][1] == "10000/m" and rows["ip"][4].startswith("tier enterprise: per client address")

    plain = Tier.objects.create(slug="plain", name="Plain")
    TierLimit.objects.create(tier=plain, name="minute", algorithm="fixed_window", limit=50, period=60)
    key = ApiKey.objects.get(prefix=make_key(plain).partition(".")[0])
    page = admin_client.get(reverse("admin:ratelimit_app_apikey_change", args=[key.pk]))
    [ip] = [row for row in effective_rows(page) if row[0] == "ip"]
    assert ip[1] == "100/m" and ip[4].startswith("RATELIMIT[&#x27;IP_RATE&#x27;]: per client address")

    ApiKeyLimit.objects.create(api_key=key, name="minute", algorithm="fixed_window", limit=500, period=60)
    page = admin_client.get(reverse("admin:ratelimit_app_apikey_change", args=[key.pk]))
    [ip] = [row for row in effective_rows(page) if row[0] == "ip"]
    assert ip[1] == "none" and "its own limits replace its tier" in ip[4]


def test_staff_set_a_tiers_per_ip_rate_in_the_admin(admin_client: Any, client: Any) -> None:
    seed_tiers()
    pro = Tier.objects.get(slug="pro")
    url = reverse("admin:ratelimit_app_tier_change", args=[pro.pk])
    data = form_data(admin_client.get(url))
    refused = admin_client.post(url, {**data, "ip_rate": "lots/m"})
    assert refused.status_code == 200 and "ip_rate" in refused.context["adminform"].form.errors
    assert admin_client.post(url, {**data, "ip_rate": "3/m"}).status_code == 302
    key = make_key("pro")
    assert [api(client, key).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert api(client, key).json()["policy"] == "ip"
