"""ratelimit_app.plans.checks: `check_stored_plans`, run by `manage.py check --database default`. Every stored
tier, limit, limit override and allow/deny rule gets every field's validation and the model's own, as
the admin would, each problem named with its row and field (what the database's constraints refuse
cannot be stored at all: tests/test_models.py); nothing is read without a database."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import CheckMessage, Error, run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from ratelimit_app.core.policies import MAX_LIMIT, MAX_PERIOD_SECONDS
from ratelimit_app.models import ApiKey, ApiKeyLimit, ClientRule, Tier, TierLimit, UserTier, UserTierLimit
from ratelimit_app.plans.checks import check_stored_plans
from tests.support.limits_support import make_key, make_tier, seed_tiers

pytestmark = pytest.mark.django_db


def errors() -> list[Error]:
    return [m for m in check_stored_plans(databases=["default"]) if isinstance(m, Error)]


def test_plans_as_the_admin_saves_them_pass() -> None:
    tier = make_tier("clean", [("minute", "fixed_window", 10, 60, None, "")])
    ClientRule.objects.create(action="allow", network="192.0.2.0/24")
    ApiKeyLimit.objects.create(api_key=ApiKey.objects.get(prefix=make_key(tier).partition(".")[0]), name="day",
                               algorithm="fixed_window", limit=5, period=86400)
    assert errors() == []


def test_without_a_database_nothing_is_read(django_assert_num_queries: Any) -> None:
    with django_assert_num_queries(0):
        assert check_stored_plans() == [] and check_stored_plans(databases=[]) == []


#: Within every column's range (the database's constraints allow it), but too large to count exactly in
#: Redis: only the policy can tell.
TOO_LARGE = {"algorithm": "token_bucket", "burst": None, "limit": MAX_LIMIT, "period": MAX_PERIOD_SECONDS}


def test_each_bad_row_is_named_with_what_is_wrong(django_user_model: Any) -> None:
    tier = make_tier("broken", [("minute", "fixed_window", 10, 60, None, "")])
    TierLimit.objects.filter(tier=tier).update(**TOO_LARGE)  # written around the admin
    api_key = ApiKey.objects.get(prefix=make_key(tier).partition(".")[0])
    key_limit = ApiKeyLimit.objects.create(api_key=api_key, name="day", algorithm="fixed_window", limit=5,
                                           period=86400)
    ApiKeyLimit.objects.filter(pk=key_limit.pk).update(**TOO_LARGE)
    user = django_user_model.objects.create_user("frank", password="pw-frank-123")
    user_limit = UserTierLimit.objects.create(user_tier=UserTier.objects.create(user=user, tier=tier), name="day",
                                              algorithm="fixed_window", limit=5, period=86400)
    UserTierLimit.objects.filter(pk=user_limit.pk).update(**TOO_LARGE)
    rule = ClientRule.objects.create(action="deny", network="192.0.2.0/24")
    ClientRule.objects.filter(pk=rule.pk).update(network="not-a-network")
    found = {(e.id, e.msg.split(":")[0]) for e in errors()}
    limit = TierLimit.objects.get(tier=tier)
    assert found == {
        ("ratelimit.E031", f"tier limit {limit.pk} (minute) of tier 'broken'"),
        ("ratelimit.E031", f"API key limit override {key_limit.pk} (day) of API key {api_key.prefix} (tier 'broken')"),
        ("ratelimit.E031", f"user limit override {user_limit.pk} (day) of user {user.pk} (tier 'broken')"),
        ("ratelimit.E032", f"client rule {rule.pk}"),
    }
    by_id = {e.msg.split(":")[0]: e for e in errors()}
    assert "too large to count exactly" in by_id[f"tier limit {limit.pk} (minute) of tier 'broken'"].msg
    assert by_id[f"client rule {rule.pk}"].hint == "The rule is ignored until it is fixed in the admin."


@pytest.mark.parametrize(("values", "problem"), [
    ({"algorithm": "leaky"}, "not a valid choice"),
    ({"algorithm": "Token_Bucket"}, "not a valid choice"),
    ({"algorithm": "fixed_window", "burst": 5}, "take a burst"),
])
def test_an_algorithm_outside_the_registry_or_a_burst_it_cannot_take_is_named(values: dict[str, Any],
                                                                            problem: str) -> None:
    """The database leaves the algorithm to the registry (a new algorithm needs no migration): the check
    names a row written around the admin."""
    tier = make_tier("odd", [("minute", "token_bucket", 10, 60, None, "")])
    TierLimit.objects.filter(tier=tier).update(**values)
    [error] = errors()
    assert error.id == "ratelimit.E031" and problem in error.msg


def test_an_error_of_no_one_field_is_shown_without_a_label() -> None:
    tier = make_tier("elsewhere", [("day", "fixed_window", 5, 86400, None, "")])
    TierLimit.objects.filter(tier=tier).update(calendar="day")
    Tier.objects.filter(pk=tier.pk).update(time_zone="Mars/Olympus")
    [limit_error] = [e for e in errors() if e.id == "ratelimit.E031"]
    assert limit_error.msg.endswith(": 'Mars/Olympus' for policy 'day' is not a known time zone")  # no "__all__"


def test_a_tier_with_an_unknown_time_zone_fails_manage_py_check() -> None:
    tier = make_tier("elsewhere", [])
    type(tier).objects.filter(pk=tier.pk).update(time_zone="Atlantis/Capital")
    [error] = errors()
    assert (error.id, error.msg.split(":")[0]) == ("ratelimit.E030", "tier 'elsewhere'")
    with pytest.raises(SystemCheckError, match="ratelimit.E030"):
        call_command("check", "--database", "default")


def plan_messages() -> list[CheckMessage]:
    return [m for m in run_checks(databases=["default"]) if (m.id or "").startswith("ratelimit.E03")]


def test_rows_written_around_the_admin_are_reported_only_with_database_checks() -> None:
    tier = make_tier("metered", [("day", "fixed_window", 5, 86400, None, "")])
    Tier.objects.filter(pk=tier.pk).update(time_zone="Mars/Olympus")
    TierLimit.objects.filter(tier=tier).update(calendar="day")
    ClientRule.objects.create(action="deny", network="10.0.0.300/8")
    assert sorted(m.id or "" for m in plan_messages()) == ["ratelimit.E030", "ratelimit.E031", "ratelimit.E032"]
    assert not [m for m in run_checks() if (m.id or "").startswith("ratelimit.E03")]  # only with --database


def test_every_field_of_a_stored_row_is_validated_not_only_the_models_own_rules() -> None:
    tier = make_tier("t", [("minute", "sliding_window", 5, 60, None, "")])
    Tier.objects.filter(pk=tier.pk).update(name="")  # a field the form requires, which no constraint covers
    messages = plan_messages()
    assert [m.id for m in messages] == ["ratelimit.E030"]
    assert "tier 't'" in messages[0].msg and "name: This field cannot be blank." in messages[0].msg


def test_a_limit_that_cannot_become_a_policy_is_reported_as_skipped_alone() -> None:
    tier = make_tier("t", [("minute", "sliding_window", 5, 60, None, ""), ("huge", "token_bucket", 5, 60, None, "")])
    # within every column's range, but too large to count exactly in Redis: only the policy can tell
    TierLimit.objects.filter(tier=tier, name="huge").update(limit=MAX_LIMIT, period=MAX_PERIOD_SECONDS)
    messages = plan_messages()
    assert [m.id for m in messages] == ["ratelimit.E031"]
    assert "tier limit" in messages[0].msg and "(huge)" in messages[0].msg and "of tier 't'" in messages[0].msg
    assert "skipped" in (messages[0].hint or "") and "other limits" in (messages[0].hint or "")


def test_a_calendar_quota_whose_stored_period_disagrees_is_not_an_error() -> None:
    """The period of a calendar quota is derived from its calendar when read, never trusted as stored."""
    tier = make_tier("t", [("month", "fixed_window", 5, 60, None, "")])
    TierLimit.objects.filter(tier=tier).update(calendar="month", period=2_592_000)
    assert plan_messages() == []


@pytest.mark.parametrize(("ip_rate", "problem"), [("ten/m", "is not a rate"), ("0/m", "would refuse every client")])
def test_a_tier_per_ip_rate_written_around_the_admin_fails_manage_py_check(ip_rate: str, problem: str) -> None:
    tier = make_tier("gold", [("minute", "sliding_window", 500, 60, None, "")])
    Tier.objects.filter(pk=tier.pk).update(ip_rate=ip_rate)
    [error] = plan_messages()
    assert error.id == "ratelimit.E030" and error.msg.startswith("tier 'gold': ip_rate: ") and problem in error.msg
    assert "RATELIMIT['IP_RATE']" in (error.hint or "")
    with pytest.raises(SystemCheckError, match="ratelimit.E030"):
        call_command("check", "--database", "default")


def test_the_seeded_per_ip_rates_pass() -> None:
    seed_tiers()
    assert dict(Tier.objects.filter(slug__in=["free", "pro", "enterprise"]).values_list("slug", "ip_rate")) == \
        {"free": "100/m", "pro": "1000/m", "enterprise": "10000/m"}
    assert plan_messages() == []


def test_a_tier_whose_per_ip_limit_caps_its_own_limits_is_warned_about(settings: Any) -> None:
    gold = make_tier("gold", [("minute", "sliding_window", 500, 60, None, "")])
    [warning] = [m for m in run_checks(databases=["default"]) if m.id == "ratelimit.W030"]
    assert warning.msg.startswith("tier 'gold': its per-IP limit (RATELIMIT['IP_RATE'] 100/m) refuses one client "
                                  "address before its limit 'minute' (500/m) does")
    gold.ip_rate = "1000/m"
    gold.save()
    assert [m for m in run_checks(databases=["default"]) if m.id == "ratelimit.W030"] == []  # seeded tiers too
    settings.RATELIMIT = {**settings.RATELIMIT, "IP_SHADOW": True}
    gold.ip_rate = "10/m"
    gold.save()
    assert [m for m in run_checks(databases=["default"]) if m.id == "ratelimit.W030"] == []  # a dry run refuses none
