"""Allow and deny lists (ClientRule) as staff edit them in the admin: a deny-listed network or key is
answered 403 with no Redis command at all; an allow-listed one is never limited; the rules are cached
like tiers and counted in the metrics."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from ratelimit_app.core.apikeys import generate_key
from ratelimit_app.models import ApiKey, ClientRule
from ratelimit_app.observability.queries import recent_metrics
from ratelimit_app.observability.recorder import flush
from tests.support.limits_support import make_key, redis_commands, seed_tiers, set_ip_rate

pytestmark = pytest.mark.django_db

ADD_URL = "admin:ratelimit_app_clientrule_add"


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_FLUSH_INTERVAL": 3600.0, **values}


def add_rule(admin_client: Client, **fields: Any) -> Any:
    """Create a rule through the admin's add form, as staff would."""
    data = {"action": "deny", "network": "", "api_key": "", "note": "", "enabled": "on", **fields}
    return admin_client.post(reverse(ADD_URL), data)


def test_a_deny_listed_network_is_refused_without_any_redis_command(
        admin_client: Client, client: Client, settings: Any, redis_url: str, key_prefix: str) -> None:
    use(settings)
    seed_tiers()
    key = make_key("free")
    assert add_rule(admin_client, action="deny", network="203.0.113.0/24", note="abuse").status_code == 302
    client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="203.0.113.7")  # warms the rules cache
    client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="198.51.100.1")  # and the key's
    with redis_commands(redis_url, key_prefix) as denied_commands:
        denied = [client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="203.0.113.7") for _ in range(3)]
    with redis_commands(redis_url, key_prefix) as allowed_commands:
        allowed = client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="198.51.100.1")
    assert [r.status_code for r in denied] == [403] * 3
    assert denied[0].json() == {"error": "client network refused by an access rule"}
    assert "X-RateLimit-Limit" not in denied[0] and "RateLimit" not in denied[0]
    assert denied_commands == []
    # one decision
    assert allowed.status_code == 200 and len(allowed_commands) == 1 and "EVALSHA" in allowed_commands[0]
    assert flush()
    stored = recent_metrics(1)
    assert (stored.denied_by_list, stored.allowed, stored.blocked) == (4, 2, 0)
    report = StringIO()
    call_command("ratelimit_metrics", "--hours", "1", stdout=report)
    assert "Allow/deny rules: 0 allowed without limits, 4 refused (403)" in report.getvalue()


def test_a_deny_listed_api_key_is_refused_before_redis(admin_client: Client, client: Client, settings: Any,
                                                       redis_url: str, key_prefix: str) -> None:
    use(settings)
    seed_tiers()
    key, other = make_key("free", name="scraper"), make_key("free")
    api_key = ApiKey.objects.get(prefix=key.partition(".")[0])
    assert add_rule(admin_client, action="deny", api_key=str(api_key.pk)).status_code == 302
    client.get("/api/users", HTTP_X_API_KEY=other)
    with redis_commands(redis_url, key_prefix) as commands:
        refused = client.get("/api/users", HTTP_X_API_KEY=key)
    assert refused.status_code == 403 and refused.json() == {"error": "API key refused by an access rule"}
    assert commands == []
    assert client.get("/api/users", HTTP_X_API_KEY=other).status_code == 200


def test_an_allow_listed_network_is_never_limited(admin_client: Client, client: Client, settings: Any,
                                                  redis_url: str, key_prefix: str) -> None:
    use(settings)  # no metrics flush inside the watched window
    seed_tiers()
    set_ip_rate("free", "2/m")
    key = make_key("free")
    assert add_rule(admin_client, action="allow", network="10.20.0.0/16", note="monitoring").status_code == 302
    client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="10.20.3.4")
    with redis_commands(redis_url, key_prefix) as commands:
        statuses = [client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="10.20.3.4").status_code
                    for _ in range(30)]  # beyond the per-IP limit and the free tier's burst of 10
    assert statuses == [200] * 30 and commands == []
    # an address outside the network is limited as usual
    assert [client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="10.21.0.1").status_code
            for _ in range(3)] == [200, 200, 429]
    # an invalid key is still refused from an allow-listed network (allow means "not limited")
    assert client.get("/api/users", HTTP_X_API_KEY=generate_key()[1], REMOTE_ADDR="10.20.3.4").status_code == 401
    assert flush()
    stored = recent_metrics(1)
    assert stored.allowed_by_list == 31 and stored.unauthorized == 1


def test_an_allow_listed_key_needs_the_full_key_not_just_its_prefix(admin_client: Client, client: Client,
                                                                     settings: Any) -> None:
    use(settings, IP_RATE=None)
    seed_tiers()
    key = make_key("free", name="internal monitoring")
    api_key = ApiKey.objects.get(prefix=key.partition(".")[0])
    assert add_rule(admin_client, action="allow", api_key=str(api_key.pk)).status_code == 302
    assert all(client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200 for _ in range(15))
    forged = f"{api_key.prefix}.{generate_key()[1].partition('.')[2]}"
    assert client.get("/api/users", HTTP_X_API_KEY=forged).status_code == 401


def test_ipv6_networks_and_deny_winning_over_allow(admin_client: Client, client: Client, settings: Any) -> None:
    use(settings, IP_RATE=None)
    seed_tiers()
    key = make_key("free")
    assert add_rule(admin_client, action="allow", network="2001:db8::/32").status_code == 302
    assert add_rule(admin_client, action="deny", network="2001:db8:bad::/48").status_code == 302
    assert client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="2001:db8:1::5").status_code == 200
    assert client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="2001:db8:bad::5").status_code == 403
    assert client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="2001:db9::5").status_code == 200


def test_the_admin_form_validates_rules(admin_client: Client) -> None:
    seed_tiers()
    make_key("free")
    api_key = ApiKey.objects.get()
    neither = add_rule(admin_client)
    both = add_rule(admin_client, network="10.0.0.0/8", api_key=str(api_key.pk))
    bad = add_rule(admin_client, network="10.0.0.300/8")
    for response in (neither, both, bad):
        assert response.status_code == 200 and response.context["adminform"].form.errors
    assert "exactly one" in str(neither.context["adminform"].form.errors)
    assert "CIDR" in str(bad.context["adminform"].form.errors["network"])
    assert add_rule(admin_client, network=" 10.1.2.3/8 ").status_code == 302
    assert ClientRule.objects.get().network == "10.0.0.0/8"  # stored canonical


def test_rules_are_cached_and_a_change_applies_at_once(admin_client: Client, client: Client, settings: Any,
                                                       django_assert_num_queries: Any) -> None:
    use(settings, IP_RATE=None)
    seed_tiers()
    key = make_key("free")
    assert add_rule(admin_client, action="deny", network="192.0.2.0/24").status_code == 302
    assert client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="192.0.2.1").status_code == 403
    assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200
    with django_assert_num_queries(0):  # warm: rules, key and tier all come from the process cache
        assert client.get("/api/users", HTTP_X_API_KEY=key).status_code == 200
        assert client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="192.0.2.1").status_code == 403
    rule = ClientRule.objects.get()
    page = admin_client.post(reverse("admin:ratelimit_app_clientrule_delete", args=[rule.pk]), {"post": "yes"})
    assert page.status_code == 302
    assert client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="192.0.2.1").status_code == 200


def test_drf_tier_throttle_refuses_a_deny_listed_client_with_403(admin_client: Client, client: Client,
                                                                 settings: Any) -> None:
    use(settings)
    seed_tiers()
    key = make_key("free")
    assert add_rule(admin_client, action="deny", network="198.51.100.0/24").status_code == 302
    response = client.get("/drf/items/", HTTP_X_API_KEY=key, REMOTE_ADDR="198.51.100.9")
    assert response.status_code == 403
    assert response.json() == {"detail": "client network refused by an access rule"}
    assert client.get("/drf/items/", HTTP_X_API_KEY=key).status_code == 200


def test_an_ipv4_mapped_network_is_stored_and_matched_as_ipv4(admin_client: Client, client: Client,
                                                              settings: Any) -> None:
    use(settings, IP_RATE=None)
    seed_tiers()
    key = make_key("free")
    # clients are matched by their IPv4 address (::ffff:10.1.2.9 is 10.1.2.9): so is the rule
    assert add_rule(admin_client, action="deny", network="::ffff:10.1.2.0/120").status_code == 302
    assert ClientRule.objects.get().network == "10.1.2.0/24"
    for address in ("10.1.2.9", "::ffff:10.1.2.9"):
        assert client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR=address).status_code == 403
    assert client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="10.1.3.9").status_code == 200


def test_a_mapped_network_written_around_the_admin_is_matched_as_ipv4(client: Client, settings: Any) -> None:
    use(settings, IP_RATE=None)
    seed_tiers()
    key = make_key("free")
    ClientRule.objects.create(action="deny", network="::ffff:10.1.2.0/120")  # no clean(): stored as written
    assert client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="10.1.2.9").status_code == 403
    assert client.get("/api/users", HTTP_X_API_KEY=key, REMOTE_ADDR="10.1.3.9").status_code == 200


def test_a_rule_whose_network_does_not_parse_is_skipped_alone_and_logged_once(client: Client, settings: Any,
                                                                             caplog: Any) -> None:
    import logging

    from ratelimit_app.plans.lookups import get_lookups, invalidate

    use(settings)
    bad = ClientRule.objects.create(action="deny", network="10.0.0.0/8")
    ClientRule.objects.filter(pk=bad.pk).update(network="10.0.0.300/8")  # written around the admin
    ClientRule.objects.create(action="deny", network="198.51.100.0/24")
    invalidate()
    with caplog.at_level(logging.ERROR, logger="ratelimit_app"):
        assert client.get("/api/users", REMOTE_ADDR="198.51.100.7").status_code == 403
        get_lookups().clear_local()
        assert client.get("/api/users", REMOTE_ADDR="198.51.100.8").status_code == 403
    skipped = [r for r in caplog.records if getattr(r, "ratelimit_event", None) == "ratelimit.rule_skipped"]
    assert len(skipped) == 1 and "10.0.0.300/8" in skipped[0].getMessage()
