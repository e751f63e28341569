"""Shadow (dry-run) limits: counted exactly as if enforced, never refusing, never in the headers; their
would-be refusals reach the metrics, Prometheus and the dashboard; switched on in the admin, they bite."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from ratelimit_app import Policy, RateLimiter
from ratelimit_app.core.keys import state_entries
from ratelimit_app.models import ApiKey, Tier, TierLimit
from ratelimit_app.observability.queries import recent_metrics
from ratelimit_app.observability.recorder import flush
from ratelimit_app.service.fallback import LocalLimiter
from tests.observability.test_prometheus import scrape, value
from tests.support.limits_support import make_key, parse_ietf, seed_tiers
from tests.test_admin import form_data

ENFORCED = Policy("hour", "fixed_window", limit=100, period=3600)
SHADOW = Policy("strict", "sliding_window", limit=3, period=3600, shadow=True)


def test_a_shadow_policy_counts_but_never_refuses(limiter: RateLimiter) -> None:
    decisions = [limiter.hit("client", [ENFORCED, SHADOW]) for _ in range(5)]
    assert all(d.allowed for d in decisions)
    assert [d.would_block for d in decisions] == [(), (), (), ("strict",), ("strict",)]
    # the shadow result is apart from the enforced ones (headers and summaries never see it)
    assert [r.policy for r in decisions[-1].results] == ["hour"] and decisions[-1].remaining == 95
    assert [d.shadow[0].remaining for d in decisions] == [2, 1, 0, 0, 0]
    # counted as if enforced: the would-be refusals were not charged to it
    assert limiter.peek("client", [SHADOW]).shadow[0].remaining == 0
    value = limiter.client.get(limiter.keys("client", [SHADOW])[0])
    assert isinstance(value, bytes)
    assert len(state_entries(value)["s" + SHADOW.name][1]) == 7 * 3  # 7-byte times, one per unit


def test_a_request_refused_by_an_enforced_policy_is_charged_to_no_shadow_policy(limiter: RateLimiter) -> None:
    tight = Policy("tight", "fixed_window", limit=1, period=3600)
    assert limiter.hit("client", [tight, SHADOW]).allowed
    refused = limiter.hit("client", [tight, SHADOW])
    assert not refused.allowed and refused.policy == "tight"
    assert limiter.peek("client", [SHADOW]).shadow[0].remaining == 2  # only the allowed request


def test_the_local_fallback_treats_shadow_policies_the_same_way() -> None:
    local = LocalLimiter()
    decisions = [local.hit("client", [ENFORCED, SHADOW]) for _ in range(5)]
    assert all(d.allowed for d in decisions)
    assert [d.would_block for d in decisions] == [(), (), (), ("strict",), ("strict",)]


def test_shadow_policies_are_distinct_from_their_enforced_twin() -> None:
    enforced = Policy("strict", "sliding_window", limit=3, period=3600)
    assert enforced != SHADOW and hash(enforced) != hash(SHADOW)
    assert Policy.__reduce__(SHADOW)[1][5] is True


@pytest.mark.django_db
def test_shadow_walk_through_from_the_admin_to_enforcement(admin_client: Client, client: Client,
                                                           settings: Any) -> None:
    """Staff add a shadow limit to the free tier, traffic flows unchanged, the dashboard says how many
    requests and which keys it would have blocked; staff then switch it to enforced."""
    settings.RATELIMIT = {**settings.RATELIMIT, "METRICS_FLUSH_INTERVAL": 3600.0}
    seed_tiers()
    # The seeded free tier refuses an 11th quick request by its burst (a bucket of 10), so the shadow
    # limit tried here is tighter than that: 5 per minute.
    free = Tier.objects.get(slug="free")
    url = reverse("admin:ratelimit_app_tier_change", args=[free.pk])
    page = admin_client.get(url)
    data = form_data(page)
    total = int(data["limits-TOTAL_FORMS"])
    data.update({"limits-TOTAL_FORMS": str(total + 1), f"limits-{total}-name": "minute-5",
                 f"limits-{total}-algorithm": "sliding_window", f"limits-{total}-limit": "5",
                 f"limits-{total}-period": "60", f"limits-{total}-enabled": "on", f"limits-{total}-shadow": "on"})
    saved = admin_client.post(url, data)
    assert saved.status_code == 302, saved.context and saved.context["adminform"].form.errors
    assert TierLimit.objects.get(tier=free, name="minute-5").shadow

    heavy, light = make_key("free", name="heavy user"), make_key("free", name="light user")
    heavy_prefix, light_prefix = heavy.partition(".")[0], light.partition(".")[0]
    before = scrape(client)
    heavy_responses = [client.get("/api/users", HTTP_X_API_KEY=heavy) for _ in range(8)]
    light_responses = [client.get("/api/users", HTTP_X_API_KEY=light) for _ in range(3)]
    # traffic flows unchanged, and the shadow limit never shows in the headers
    assert [r.status_code for r in heavy_responses + light_responses] == [200] * 11
    assert set(parse_ietf(heavy_responses[-1]["RateLimit-Policy"])) == {"ip", "burst", "minute", "day"}
    assert "minute-5" not in heavy_responses[-1]["RateLimit"]

    # 3 of the heavy key's requests (its 6th, 7th and 8th) would have been refused; none of the light key's
    after = scrape(client)
    assert value(after, "ratelimit_shadow_blocked_total", tier="free", policy="minute-5") - value(
        before, "ratelimit_shadow_blocked_total", tier="free", policy="minute-5") == 3
    assert flush()
    stored = recent_metrics(1)
    assert [(s.tier, s.policy, s.count) for s in stored.shadow] == [("free", "minute-5", 3)]
    assert [(t.identity, t.blocked) for t in stored.top_shadow_blocked] == [(f"key:{heavy_prefix}", 3)]
    assert stored.blocked == 0 and stored.allowed == 11
    report = StringIO()
    call_command("ratelimit_metrics", "--hours", "1", stdout=report)
    lines = report.getvalue().splitlines()
    assert lines[lines.index("Shadow limits would have blocked:") + 2].split() == ["free", "minute-5", "3"]
    assert lines[lines.index("Top would-be-blocked (UTC days of the range):") + 2].split() == [
        f"key:{heavy_prefix}", "(heavy", "user)", "3"]  # the key's name beside its prefix
    dashboard = admin_client.get(reverse("ratelimit_dashboard"), {"hours": 6}).content.decode()
    shadow_panel = dashboard.split('id="rl-shadow"')[1].split("</table>")[0]
    assert "minute-5" in shadow_panel and ">3<" in shadow_panel
    top_panel = dashboard.split('id="rl-shadow-top"')[1].split("</table>")[0]
    heavy_page = reverse("admin:ratelimit_app_apikey_change", args=[ApiKey.objects.get(prefix=heavy_prefix).pk])
    assert f"key:{heavy_prefix}" in top_panel and heavy_page in top_panel and light_prefix not in top_panel

    # Staff switch it to enforced: the count carried over (5 used by the heavy key, 3 by the light one)
    page = admin_client.get(url)
    data = form_data(page)
    form = next(f for f in page.context["inline_admin_formsets"][0].formset.forms if f.instance.name == "minute-5")
    del data[form.add_prefix("shadow")]
    assert admin_client.post(url, data).status_code == 302
    assert not TierLimit.objects.get(tier=free, name="minute-5").shadow
    refused = client.get("/api/users", HTTP_X_API_KEY=heavy)
    assert refused.status_code == 429 and refused.json()["policy"] == "minute-5"
    assert [client.get("/api/users", HTTP_X_API_KEY=light).status_code for _ in range(3)] == [200, 200, 429]


def test_a_shadow_refusal_in_one_check_refuses_no_other_check_of_the_call(limiter: RateLimiter) -> None:
    # the binary reply has no flag for shadow policies: parse_reply knows them from the call it built
    tight = Policy("tight", "fixed_window", limit=1, period=3600, shadow=True)
    for expected_blocks in [(), ("tight",), ("tight",)]:
        ip, key = limiter.hit_many([("ip", [tight]), ("key", [ENFORCED])])
        assert ip.allowed and key.allowed and ip.would_block == expected_blocks
    assert limiter.peek("key", [ENFORCED]).remaining == 97  # every request charged to the enforced policy
    assert limiter.peek("ip", [tight]).shadow[0].remaining == 0  # the shadow one charged once


def test_the_async_engine_splits_shadow_results_the_same_way(redis_url: str, key_prefix: str) -> None:
    import asyncio

    import redis.asyncio

    from ratelimit_app import AsyncRateLimiter
    from ratelimit_app.core.redispy import close_client

    async def main() -> list[Any]:
        client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(redis_url, socket_timeout=10)
        try:
            limiter = AsyncRateLimiter(client, prefix=key_prefix)
            return [await limiter.hit("client", [ENFORCED, SHADOW]) for _ in range(5)]
        finally:
            await close_client(client)  # (redis-py 5.0.0 has no aclose)

    decisions = asyncio.run(main())
    assert all(d.allowed for d in decisions)
    assert [d.would_block for d in decisions] == [(), (), (), ("strict",), ("strict",)]
    assert [d.shadow[0].remaining for d in decisions] == [2, 1, 0, 0, 0]
