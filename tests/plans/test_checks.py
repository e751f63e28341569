"""ratelimit_app.plans.checks: `check_stored_plans`, run by `manage.py check --database default`. Every stored
tier, limit, limit override and allow/deny rule is validated as the admin would, each problem named
with its row and field; nothing is read without a database."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from ratelimit_app.models import ApiKey, ApiKeyLimit, ClientRule, TierLimit, UserTier, UserTierLimit
from ratelimit_app.plans.checks import check_stored_plans
from tests.support.limits_support import make_key, make_tier

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


def test_each_bad_row_is_named_with_what_is_wrong(django_user_model: Any) -> None:
    tier = make_tier("broken", [("minute", "fixed_window", 10, 60, None, "")])
    TierLimit.objects.filter(tier=tier).update(burst=5)  # a burst on fixed_window, written around the admin
    api_key = ApiKey.objects.get(prefix=make_key(tier).partition(".")[0])
    key_limit = ApiKeyLimit.objects.create(api_key=api_key, name="day", algorithm="fixed_window", limit=5,
                                           period=86400)
    ApiKeyLimit.objects.filter(pk=key_limit.pk).update(limit=0)
    user = django_user_model.objects.create_user("frank", password="pw-frank-123")
    user_limit = UserTierLimit.objects.create(user_tier=UserTier.objects.create(user=user, tier=tier), name="day",
                                              algorithm="fixed_window", limit=5, period=86400)
    UserTierLimit.objects.filter(pk=user_limit.pk).update(algorithm="leaky_bucket")
    rule = ClientRule.objects.create(action="deny", network="192.0.2.0/24")
    ClientRule.objects.filter(pk=rule.pk).update(network="not-a-network")
    found = {(e.id, e.msg.split(":")[0]) for e in errors()}
    limit = TierLimit.objects.get(tier=tier)
    assert found == {
        ("ratelimit.E031", f"tier limit {limit.pk} (minute)"),
        ("ratelimit.E031", f"API key limit override {key_limit.pk} (day)"),
        ("ratelimit.E031", f"user limit override {user_limit.pk} (day)"),
        ("ratelimit.E032", f"client rule {rule.pk}"),
    }
    by_id = {e.msg.split(":")[0]: e for e in errors()}
    assert "burst" in by_id[f"tier limit {limit.pk} (minute)"].msg
    assert by_id[f"user limit override {user_limit.pk} (day)"].msg == (
        f"user limit override {user_limit.pk} (day): 'leaky_bucket' for policy 'day' is not one of fixed_window, "
        "sliding_window, sliding_window_counter, token_bucket, gcra, concurrency")  # no "__all__" label
    assert by_id[f"client rule {rule.pk}"].hint == "The rule is ignored until it is fixed in the admin."


def test_a_tier_with_an_unknown_time_zone_fails_manage_py_check() -> None:
    tier = make_tier("elsewhere", [])
    type(tier).objects.filter(pk=tier.pk).update(time_zone="Atlantis/Capital")
    [error] = errors()
    assert (error.id, error.msg.split(":")[0]) == ("ratelimit.E030", "tier 'elsewhere'")
    with pytest.raises(SystemCheckError, match="ratelimit.E030"):
        call_command("check", "--database", "default")
