"""ratelimit_app.management.commands._targets: `resolve`, what `ratelimit_status` and `ratelimit_reset` act
on. Keys (by prefix, key:<prefix> or the full key), users, addresses and networks; the effective limits
(overrides applied, every scope); and a CommandError naming what is wrong, never echoing a secret."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management.base import CommandError

from ratelimit_app.management.commands._targets import resolve
from ratelimit_app.models import ApiKey, ApiKeyLimit, Tier, UserTier, UserTierLimit
from ratelimit_app.plans.lookups import invalidate
from tests.support.limits_support import LimitSpec, make_key, make_tier

pytestmark = pytest.mark.django_db
LIMITS: list[LimitSpec] = [("minute", "fixed_window", 10, 60, None, ""),
                           ("minute", "fixed_window", 2, 60, None, "search")]


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


def test_a_key_is_named_by_its_prefix_however_it_is_given() -> None:
    key = make_key(make_tier("targets", LIMITS), name="mobile")
    prefix = key.partition(".")[0]
    for text in (prefix, f"key:{prefix}", key, f"  {prefix} "):
        target = resolve(text)
        assert target.description == f"API key {prefix} (mobile, active)"
        [check] = target.checks
        assert (check.identity, check.label) == (f"key:{prefix}", "tier targets")
        assert [p.name for p in check.policies] == ["minute", "search.minute"]  # every scope's limits too


def test_a_keys_own_limits_and_its_state_are_shown() -> None:
    key = make_key(make_tier("targets", LIMITS))
    api_key = ApiKey.objects.get(prefix=key.partition(".")[0])
    ApiKeyLimit.objects.create(api_key=api_key, name="minute", algorithm="gcra", limit=99, period=60)
    ApiKeyLimit.objects.create(api_key=api_key, name="day", algorithm="fixed_window", limit=5, period=86400)
    api_key.revoked = True
    api_key.save()
    target = resolve(api_key.prefix)
    assert target.description.endswith("revoked)")
    policies = {p.name: p for p in target.checks[0].policies}
    assert set(policies) == {"minute", "day", "search.minute"} and policies["minute"].limit == 99


def test_a_user_is_limited_by_their_tier_with_their_own_limits_else_the_default(settings: Any,
                                                                               django_user_model: Any) -> None:
    tier = make_tier("targets", LIMITS)
    grace = django_user_model.objects.create_user("grace", password="pw-grace-123")
    UserTierLimit.objects.create(user_tier=UserTier.objects.create(user=grace, tier=tier), name="minute",
                                 algorithm="fixed_window", limit=1, period=60, enabled=False)
    target = resolve(f"user:{grace.pk}")
    assert target.description == f"user {grace.pk} (grace)" and target.tier is not None
    assert [p.name for p in target.checks[0].policies] == ["search.minute"]  # her override removes the minute
    heidi = django_user_model.objects.create_user("heidi", password="pw-heidi-123")
    use(settings, DEFAULT_USER_TIER="targets")
    assert resolve(f"user:{heidi.pk}").checks[0].identity == f"user:{heidi.pk}"
    use(settings, DEFAULT_USER_TIER=None)
    with pytest.raises(CommandError, match=rf"user:{heidi.pk} has no tier and RATELIMIT\['DEFAULT_USER_TIER'\]"):
        resolve(f"user:{heidi.pk}")
    with pytest.raises(CommandError, match="user:abc: not a valid user id"):
        resolve("user:abc")


def test_an_address_or_network_is_limited_by_the_per_ip_limit_and_the_anonymous_tier(settings: Any) -> None:
    make_tier("anon", LIMITS)
    use(settings, IPV6_PREFIX=48, ANONYMOUS_TIER="anon", REQUIRE_API_KEY=False)
    target = resolve("ip:2001:db8:1:2::7")
    assert target.description == "client address ip:2001:db8:1::/48"
    assert [(c.identity, c.label) for c in target.checks] == [
        ("ip:2001:db8:1::/48", "per-IP limit (RATELIMIT['IP_RATE'])"),
        *[(f"ip:2001:db8:1::/48@{slug}", f"per-IP limit of tier {slug}") for slug in ("enterprise", "free", "pro")],
        ("ip:2001:db8:1::/48", "anonymous tier anon")]
    assert resolve("ip:192.0.2.77/24").checks[0].identity == "ip:192.0.2.0/24"  # a network, as the middleware has it
    use(settings, IP_RATE=None)
    Tier.objects.update(ip_rate="")  # no tier sets its own per-IP rate
    invalidate()
    assert [c.label for c in resolve("ip:192.0.2.7").checks] == ["anonymous tier anon"]
    use(settings, ANONYMOUS_TIER=None)
    with pytest.raises(CommandError, match=r"ip:192.0.2.7 is not limited: RATELIMIT\['IP_RATE'\] and "
                                           r"\['ANONYMOUS_TIER'\] are None"):
        resolve("ip:192.0.2.7")
    use(settings, IP_RATE="10/m", ANONYMOUS_TIER="gone")
    with pytest.raises(CommandError, match=r"RATELIMIT\['ANONYMOUS_TIER'\] names tier 'gone', which does not exist"):
        resolve("ip:192.0.2.7")


@pytest.mark.parametrize("text", ["abc.S3cretS3cretS3cret", "AbCd12.S3cretS3cretS3cret", "x.S3cret"])
def test_what_is_not_a_key_prefix_is_refused_without_echoing_what_follows_a_dot(text: str) -> None:
    with pytest.raises(CommandError, match="is not an API key prefix") as raised:
        resolve(text)
    assert "S3c" not in str(raised.value)
    assert f"'{text.partition('.')[0]}…'" in str(raised.value)


def test_a_prefix_of_the_right_shape_that_names_no_key() -> None:
    with pytest.raises(CommandError, match="no API key with prefix 'Zz9Zz9Zz'"):
        resolve("key:Zz9Zz9Zz")
    with pytest.raises(CommandError, match="'ÄbCd1234' is not an API key prefix"):
        resolve("ÄbCd1234")  # letters, but not ASCII ones
