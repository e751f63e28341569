"""ratelimit_app.plans.compile: `TierInfo` (every policy once, the policies of a scope), `KeyInfo.refusal`, the
loaders' plain rows and what `build_tier` and `apply_overrides` compile from them, read from the real
database; a row that cannot become a policy is skipped alone (logged once), never its tier's other limits
or the per-IP limit."""

from __future__ import annotations

import logging
import pickle
from datetime import datetime, timezone
from typing import Any

import pytest
from django.test import Client

from ratelimit_app import Policy
from ratelimit_app.core.policies import MAX_LIMIT, MAX_PERIOD_SECONDS
from ratelimit_app.models import ApiKey, ApiKeyLimit, ClientRule, Tier, TierLimit, UserTier, UserTierLimit
from ratelimit_app.plans.compile import (
    KeyInfo,
    TierInfo,
    apply_overrides,
    build_tier,
    load_client_rules,
    load_key_row,
    load_tier_row,
    load_user_plan,
)
from ratelimit_app.plans.lookups import get_lookups, invalidate
from tests.support.limits_support import make_key, make_tier, parse_ietf

MINUTE = Policy("minute", "fixed_window", limit=10, period=60)
DAY = Policy("day", "fixed_window", limit=100, period=86400)
SEARCH = Policy("search.minute", "fixed_window", limit=2, period=60)
EXPORT = Policy("export.day", "fixed_window", limit=1, period=86400)


def tier_info() -> TierInfo:
    return TierInfo("basic", "Basic", None, (MINUTE, DAY), {"search": (MINUTE, DAY, SEARCH),
                                                           "export": (MINUTE, DAY, EXPORT)})


def test_every_policy_is_each_policy_once_unscoped_first_then_by_scope() -> None:
    assert tier_info().every_policy() == (MINUTE, DAY, EXPORT, SEARCH)
    assert TierInfo("empty", "Empty", None, ()).every_policy() == ()


def test_the_policies_of_a_scope_and_of_none() -> None:
    tier = tier_info()
    assert tier.policies_for("search") == (MINUTE, DAY, SEARCH)
    assert tier.policies_for(None) == tier.policies_for("") == tier.policies_for("unknown") == (MINUTE, DAY)


@pytest.mark.parametrize(("revoked", "expires_at", "now", "refusal"), [
    (False, None, 1e12, None), (False, 100.0, 99.999, None), (False, 100.0, 100.0, "expired"),
    (True, None, 0.0, "revoked"), (True, 100.0, 200.0, "revoked"),
])
def test_why_a_key_is_refused(revoked: bool, expires_at: float | None, now: float, refusal: str | None) -> None:
    info = KeyInfo(1, "AbCd1234", "k", "hash", "basic", revoked, expires_at, None)
    assert info.refusal(now) == refusal


@pytest.mark.django_db
def test_a_tier_compiles_its_enabled_limits_with_its_fail_mode_and_time_zone() -> None:
    tier = make_tier("compiled", [("minute", "fixed_window", 10, 60, None, ""),
                                  ("day", "fixed_window", 100, 86400, None, ""),
                                  ("minute", "fixed_window", 2, 60, None, "search")], fail_mode="closed")
    tier.time_zone = "Europe/Paris"
    tier.save()
    TierLimit.objects.create(tier=tier, name="off", algorithm="fixed_window", limit=1, period=60, enabled=False)
    TierLimit.objects.create(tier=tier, name="month", algorithm="fixed_window", limit=5000, period=2678400,
                             calendar="month")
    row = load_tier_row("compiled")
    # shared through the Django cache, which pickles it (here: bytes this test made)
    assert row is not None and pickle.loads(pickle.dumps(row)) == row  # noqa: S301
    info = build_tier(row)
    assert (info.slug, info.name, info.fail_mode, info.time_zone) == ("compiled", "Compiled", "closed", "Europe/Paris")
    assert [p.name for p in info.policies] == ["minute", "day", "month"]  # by period; disabled ones left out
    month = info.policies[2]
    assert (month.calendar, month.time_zone) == ("month", "Europe/Paris")
    assert [p.name for p in info.policies_for("search")] == ["minute", "day", "month", "search.minute"]
    assert load_tier_row("nosuchtier") is None
    Tier.objects.filter(slug="compiled").update(fail_mode="")
    assert build_tier(load_tier_row("compiled") or ()).fail_mode is None  # "" follows RATELIMIT['FAIL_MODE']


def test_overrides_replace_in_place_remove_when_disabled_and_add_at_the_end() -> None:
    merged = apply_overrides(tier_info(), (
        ("day", "gcra", 50, 86400, 5, "", True, False),  # replaces the tier's day, where it was
        ("minute", "fixed_window", 1, 60, None, "", False, False),  # disabled: removes the tier's minute
        ("hour", "fixed_window", 30, 3600, None, "", True, True),  # a new name: added, here a shadow one
        ("minute", "fixed_window", 9, 60, None, "export", True, False),  # a scope's own, added to that scope
        ("ghost", "fixed_window", 1, 60, None, "", False, False),  # disabled and matching nothing: no-op
    ))
    assert [p.name for p in merged.policies] == ["day", "hour"]
    assert merged.policies[0] == Policy("day", "gcra", limit=50, period=86400, burst=5)
    assert merged.policies[1].shadow
    assert [p.name for p in merged.policies_for("export")] == ["day", "hour", "export.day", "export.minute"]
    assert [p.name for p in merged.policies_for("search")] == ["day", "hour", "search.minute"]
    assert (merged.slug, merged.name, merged.fail_mode, merged.time_zone) == ("basic", "Basic", None, "UTC")
    assert apply_overrides(tier_info(), ()) == tier_info()


@pytest.mark.django_db
def test_a_keys_row_carries_its_expiry_as_unix_time_and_its_own_limits(django_user_model: Any) -> None:
    owner = django_user_model.objects.create_user("dora", password="pw-dora-123")
    expires = datetime(2099, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    key = make_key(make_tier("keyed", [("minute", "fixed_window", 10, 60, None, "")]), name="mobile",
                   owner=owner, expires=expires)
    prefix = key.partition(".")[0]
    api_key = ApiKey.objects.get(prefix=prefix)
    ApiKeyLimit.objects.create(api_key=api_key, name="minute", algorithm="fixed_window", limit=99, period=60)
    row = load_key_row(prefix)
    assert row is not None
    info = KeyInfo(*row)
    assert (info.prefix, info.name, info.tier_slug, info.revoked, info.owner_id) == \
        (prefix, "mobile", "keyed", False, owner.pk)
    assert info.expires_at == expires.timestamp() and info.hashed_key == api_key.hashed_key
    assert info.overrides == (("minute", "fixed_window", 99, 60, None, "", True, False, "", ""),)
    assert key not in repr(row)  # never the key itself
    assert load_key_row("Zz9Zz9Zz") is None


@pytest.mark.django_db
def test_a_users_plan_is_their_tier_and_own_limits(django_user_model: Any) -> None:
    tier = make_tier("users", [("minute", "fixed_window", 10, 60, None, "")])
    erin = django_user_model.objects.create_user("erin", password="pw-erin-123")
    assert load_user_plan(str(erin.pk)) is None
    assignment = UserTier.objects.create(user=erin, tier=tier)
    UserTierLimit.objects.create(user_tier=assignment, name="day", algorithm="fixed_window", limit=7, period=86400,
                                 shadow=True)
    assert load_user_plan(str(erin.pk)) == ("users", (("day", "fixed_window", 7, 86400, None, "", True, True, "", ""),))


@pytest.mark.django_db
def test_client_rules_are_the_enabled_ones_with_their_key_prefix() -> None:
    key = make_key(make_tier("ruled", [("minute", "fixed_window", 10, 60, None, "")]))
    api_key = ApiKey.objects.get(prefix=key.partition(".")[0])
    ClientRule.objects.create(action="deny", network="203.0.113.0/24")
    ClientRule.objects.create(action="allow", api_key=api_key)
    ClientRule.objects.create(action="deny", network="198.51.100.0/24", enabled=False)
    assert sorted(load_client_rules("")) == [("allow", "", api_key.prefix), ("deny", "203.0.113.0/24", None)]


def _unenforceable(**filters: Any) -> None:
    """Make the matching rows too large to count exactly in Redis (every column stays in range)."""
    TierLimit.objects.filter(**filters).update(algorithm="token_bucket", burst=None, limit=MAX_LIMIT,
                                               period=MAX_PERIOD_SECONDS)
    invalidate()  # update() bypasses the signals


def skipped_records(caplog: Any) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "ratelimit_event", None) == "ratelimit.limit_skipped"]


@pytest.mark.django_db
def test_a_limit_that_cannot_become_a_policy_is_skipped_alone_and_logged_once(caplog: Any) -> None:
    make_tier("t", [("minute", "sliding_window", 5, 60, None, ""), ("huge", "sliding_window", 5, 60, None, ""),
                    ("write", "sliding_window", 2, 60, None, "write")])
    _unenforceable(tier__slug="t", name="huge")
    with caplog.at_level(logging.DEBUG, logger="ratelimit_app"):
        tier = get_lookups().tier("t")
        get_lookups().clear_local()
        assert get_lookups().tier("t") == tier  # compiled again: the same skip, not logged again
    assert tier is not None
    assert [p.name for p in tier.policies] == ["minute"]
    assert [p.name for p in tier.policies_for("write")] == ["minute", "write.write"]
    records = skipped_records(caplog)
    assert len(records) == 1 and records[0].levelno == logging.ERROR
    assert records[0].ratelimit["tier"] == "t" and records[0].ratelimit["limit"] == "huge"  # type: ignore[attr-defined]


@pytest.mark.django_db
@pytest.mark.parametrize("values", [{"algorithm": "leaky"}, {"algorithm": "fixed_window", "burst": 5}])
def test_a_limit_of_an_algorithm_outside_the_registry_or_with_a_burst_it_cannot_take_is_skipped_alone(
        values: dict[str, Any]) -> None:
    make_tier("t", [("minute", "sliding_window", 5, 60, None, ""), ("odd", "token_bucket", 5, 60, None, "")])
    TierLimit.objects.filter(tier__slug="t", name="odd").update(**values)
    invalidate()  # update() bypasses the signals
    tier = get_lookups().tier("t")
    assert tier is not None and [p.name for p in tier.policies] == ["minute"]


@pytest.mark.django_db
def test_a_calendar_quota_in_a_tier_with_an_unknown_time_zone_is_skipped_alone() -> None:
    tier = make_tier("t", [("minute", "sliding_window", 5, 60, None, ""), ("day", "fixed_window", 9, 86400, None, "")])
    TierLimit.objects.filter(tier=tier, name="day").update(calendar="day")
    Tier.objects.filter(pk=tier.pk).update(time_zone="Mars/Olympus")
    invalidate()
    info = get_lookups().tier("t")
    assert info is not None and [p.name for p in info.policies] == ["minute"]


@pytest.mark.django_db
def test_an_override_that_cannot_become_a_policy_leaves_the_tier_limit_in_force() -> None:
    tier = make_tier("t", [("minute", "sliding_window", 5, 60, None, "")])
    api_key, _ = ApiKey.objects.create_key(name="acme", tier=tier)
    ApiKeyLimit.objects.create(api_key=api_key, name="minute", algorithm="token_bucket", limit=50, period=60)
    ApiKeyLimit.objects.create(api_key=api_key, name="extra", algorithm="gcra", limit=50, period=60)
    ApiKeyLimit.objects.filter(api_key=api_key, name="minute").update(limit=MAX_LIMIT, period=MAX_PERIOD_SECONDS)
    invalidate()
    info, key = get_lookups().tier("t"), get_lookups().key(api_key.prefix)
    assert info is not None and key is not None
    merged = apply_overrides(info, key.overrides)
    assert [(p.name, p.limit) for p in merged.policies] == [("minute", 5), ("extra", 50)]


@pytest.mark.django_db
def test_requests_of_a_tier_with_one_bad_row_keep_every_other_limit(client: Client) -> None:
    make_tier("t", [("minute", "sliding_window", 3, 60, None, ""), ("huge", "sliding_window", 5, 60, None, "")])
    _unenforceable(tier__slug="t", name="huge")
    key = make_key("t")
    responses = [client.get("/api/users", HTTP_X_API_KEY=key) for _ in range(4)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    assert set(parse_ietf(responses[0]["RateLimit-Policy"])) == {"ip", "minute"}
    assert responses[3].json()["policy"] == "minute"


def test_a_tiers_per_ip_rate_is_compiled_and_one_that_cannot_be_counted_falls_back_to_the_default(
        caplog: Any) -> None:
    own = build_tier(("t", "T", "", [], "UTC", "500/m"))
    assert own.ip_policies is not None
    [ip] = own.ip_policies
    assert (ip.name, ip.limit, ip.period) == ("ip", 500, 60)
    assert build_tier(("t", "T", "", [], "UTC", "")).ip_policies is None
    with caplog.at_level(logging.ERROR, logger="ratelimit_app"):
        assert build_tier(("broken-ip", "T", "", [], "UTC", "ten/m")).ip_policies is None
    [record] = skipped_records(caplog)
    assert record.levelno == logging.ERROR
    assert (record.ratelimit["tier"], record.ratelimit["limit"]) == ("broken-ip", "ip")  # type: ignore[attr-defined]
