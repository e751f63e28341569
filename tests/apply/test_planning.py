"""ratelimit_app.apply.planning: `limit_config`, `path_scope` and `PathScope.applies`, and `plan_request` (who the
client is and which checks apply: keys, users, the anonymous tier, refusals, allow and deny rules, the
per-IP peek before an unseen key's lookup, the load shedder's fleet check) with `RequestPlan.plus`; against
the real database and Redis."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory
from django.utils import timezone

from ratelimit_app import Policy
from ratelimit_app.apply.limitcheck import LimitCheck
from ratelimit_app.apply.outcome import DENIED, FORBIDDEN, LimitOutcome
from ratelimit_app.apply.planning import RequestPlan, limit_config, path_scope, plan_request
from ratelimit_app.apply.shedding import FLEET_IDENTITY
from ratelimit_app.models import ApiKey, ApiKeyLimit, ClientRule, Tier, UserTier
from ratelimit_app.plans.lookups import invalidate
from ratelimit_app.service.limiter import get_limiter
from tests.support.limits_support import make_key, make_tier

pytestmark = pytest.mark.django_db
factory = RequestFactory()
IP = "198.51.100.23"


def use(settings: Any, **values: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, **values}


def headers(key: str | None) -> dict[str, Any]:
    return {"HTTP_X_API_KEY": key} if key else {}


def request(key: str | None = None, path: str = "/api/things", user: Any = None) -> Any:
    made = factory.get(path, REMOTE_ADDR=IP, **headers(key))
    if user is not None:
        made.user = user
    return made


def plan(*args: Any, **kwargs: Any) -> RequestPlan:
    planned = plan_request(*args, **kwargs)
    assert isinstance(planned, RequestPlan), planned
    return planned


@pytest.fixture
def tier() -> Tier:
    return make_tier("planned", [("minute", "fixed_window", 10, 60, None, ""),
                                 ("uploads", "fixed_window", 2, 60, None, "upload")], fail_mode="closed")


def test_limit_config_follows_the_settings(settings: Any) -> None:
    use(settings, PATH_PREFIXES=["/api/", "/v2/"], EXEMPT_PATHS=["/api/health"], IP_RATE="7/s",
        IP_ALGORITHM="gcra", IP_SHADOW=True, FAIL_MODE="local")
    scope = path_scope()
    assert scope.applies("/api/users") and scope.applies("/v2/x")
    assert not scope.applies("/api/health") and not scope.applies("/api/health/db") and not scope.applies("/admin/")
    assert scope.applies("/api/healthz") and scope.applies("/api/health/../users")  # by segment, every reading
    config = limit_config()
    [ip] = config.ip_policies
    assert (ip.name, ip.algorithm, ip.limit, ip.period, ip.shadow) == ("ip", "gcra", 7, 1, True)
    assert config.fail_mode == "local"
    use(settings, IP_RATE=None)
    assert limit_config().ip_policies == ()


def test_a_key_is_planned_with_the_per_ip_limit_and_its_tiers_policies_for_the_scope(tier: Tier) -> None:
    key = make_key(tier)
    prefix = key.partition(".")[0]
    planned = plan(request(key))
    assert [c.identity for c in planned.checks] == [f"ip:{IP}", f"key:{prefix}"]
    assert [p.name for p in planned.checks[1].policies] == ["minute"]
    assert (planned.identity, planned.label, planned.fail_mode, planned.tier_fail_mode) == \
        (f"key:{prefix}", "planned", "closed", "closed")
    assert planned.tier is not None and planned.tier.slug == "planned" and planned.refusal == ""
    scoped = plan(request(key), scope="upload")
    assert [p.name for p in scoped.checks[1].policies] == ["minute", "upload.uploads"]


def test_a_tier_with_its_own_per_ip_limit_is_counted_per_address_and_tier(tier: Tier, settings: Any) -> None:
    use(settings, IP_ALGORITHM="gcra", IP_SHADOW=True)
    Tier.objects.filter(pk=tier.pk).update(ip_rate="500/m")
    invalidate()
    key = make_key(tier)
    planned = plan(request(key))
    assert [c.identity for c in planned.checks] == [f"ip:{IP}@planned", f"key:{key.partition('.')[0]}"]
    [ip] = planned.checks[0].policies
    assert (ip.name, ip.algorithm, ip.limit, ip.period, ip.shadow) == ("ip", "gcra", 500, 60, True)
    # a request without a usable key, and one of the anonymous tier, are counted on the address' default
    assert [c.identity for c in plan(request("AbCd1234.x")).checks] == [f"ip:{IP}"]
    use(settings, ANONYMOUS_TIER="planned", REQUIRE_API_KEY=False)
    anonymous = plan(request())
    assert [c.identity for c in anonymous.checks] == [f"ip:{IP}", f"ip:{IP}"] and anonymous.label == "planned"
    assert anonymous.checks[0].policies == limit_config().ip_policies


def test_an_override_that_replaces_or_removes_a_tier_limit_frees_the_client_from_the_per_ip_limit(
        tier: Tier) -> None:
    raised, restricted, plain = make_key(tier, name="raised"), make_key(tier, name="restricted"), make_key(tier)
    api_key = ApiKey.objects.get(prefix=raised.partition(".")[0])
    ApiKeyLimit.objects.create(api_key=api_key, name="minute", algorithm="fixed_window", limit=500, period=60)
    removed = make_key(tier, name="removed")
    ApiKeyLimit.objects.create(api_key=ApiKey.objects.get(prefix=removed.partition(".")[0]), name="minute",
                               algorithm="fixed_window", limit=1, period=60, enabled=False)
    ApiKeyLimit.objects.create(api_key=ApiKey.objects.get(prefix=restricted.partition(".")[0]), name="month",
                               algorithm="fixed_window", limit=100, period=2_592_000)
    for key in (raised, removed):
        assert [c.identity for c in plan(request(key)).checks] == [f"key:{key.partition('.')[0]}"]
    for key in (restricted, plain):  # a limit added on top gives nothing more: the per-IP limit stays
        assert plan(request(key)).checks[0].identity == f"ip:{IP}"


@pytest.mark.parametrize(("change", "message"), [
    (lambda key: "AbCd1234.x", "malformed API key"),
    (lambda key: "Zz9Zz9Zz." + "a" * 43, "unknown API key"),
    (lambda key: key[:-1] + ("b" if key[-1] != "b" else "c"), "unknown API key"),  # the right prefix, a wrong secret
])
def test_an_unusable_key_is_planned_against_the_per_ip_limit_alone(tier: Tier, change: Any, message: str) -> None:
    planned = plan(request(change(make_key(tier))))
    assert planned.refusal == message and planned.tier is None and planned.identity == f"ip:{IP}"
    assert [c.identity for c in planned.checks] == [f"ip:{IP}"]
    assert planned.fail_mode == "open"  # no tier: RATELIMIT['FAIL_MODE']


def test_revoked_and_expired_keys_say_which(tier: Tier) -> None:
    revoked = make_key(tier)
    ApiKey.objects.filter(prefix=revoked.partition(".")[0]).update(revoked=True)
    expired = make_key(tier, expires=timezone.now() + timedelta(seconds=1))
    ApiKey.objects.filter(prefix=expired.partition(".")[0]).update(expires=timezone.now() - timedelta(seconds=1))
    assert plan(request(revoked)).refusal == "API key revoked"
    assert plan(request(expired)).refusal == "API key expired"


def test_an_ip_over_its_limit_is_refused_before_an_unseen_key_is_looked_up(
    tier: Tier, settings: Any, django_assert_num_queries: Any
) -> None:
    use(settings, IP_RATE="2/m", IP_ALGORITHM="fixed_window")
    ip = (Policy("ip", "fixed_window", limit=2, period=60),)
    for _ in range(2):
        get_limiter().hit(f"ip:{IP}", ip)
    unseen = "QqQqQqQq." + "a" * 43
    plan(request())  # the allow/deny rules are in this process' cache now
    with django_assert_num_queries(0):
        refused = plan_request(request(unseen))
    assert isinstance(refused, LimitOutcome) and refused.status == DENIED
    assert refused.decision is not None and refused.decision.policy == "ip" and refused.identity == f"ip:{IP}"
    assert get_limiter().peek(f"ip:{IP}", ip).remaining == 0  # the peek charged nothing


def test_a_user_gets_their_tier_else_the_default_user_tier(tier: Tier, settings: Any,
                                                           django_user_model: Any) -> None:
    alice = django_user_model.objects.create_user("alice", password="pw-alice-123")
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    UserTier.objects.create(user=alice, tier=tier)
    make_tier("fallback", [("minute", "fixed_window", 5, 60, None, "")])
    use(settings, DEFAULT_USER_TIER="fallback")
    assert plan(request(user=alice)).label == "planned"
    assert plan(request(user=bob)).label == "fallback" and plan(request(user=bob)).identity == f"user:{bob.pk}"
    assert plan(request(), user=alice).label == "planned"  # DRF passes the user it authenticated
    use(settings, DEFAULT_USER_TIER=None, ANONYMOUS_TIER=None)
    assert plan(request(user=bob)).refusal == "API key required"


def test_without_require_api_key_a_client_without_key_user_or_anonymous_tier_has_the_per_ip_limit_alone(
    tier: Tier, settings: Any, django_user_model: Any
) -> None:
    use(settings, REQUIRE_API_KEY=False, DEFAULT_USER_TIER=None)
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    jwt = factory.get("/api/things", REMOTE_ADDR=IP, HTTP_AUTHORIZATION="Bearer eyJhbGciOiJIUzI1NiJ9.e30.c2ln")
    for planned in (plan(request()), plan(request(user=bob)), plan(request("team-key")), plan(jwt)):
        assert [c.identity for c in planned.checks] == [f"ip:{IP}"] and planned.refusal == ""
        assert (planned.tier, planned.identity, planned.label, planned.fail_mode) == (None, f"ip:{IP}", "ip", "open")
    use(settings, IP_RATE=None)
    assert plan(request()).checks == ()  # nothing of ours limits it: no Redis call, no headers
    # a value in our key format is ours, and verified, whatever REQUIRE_API_KEY says
    assert plan(request("Zz9Zz9Zz." + "a" * 43)).refusal == "unknown API key"


def test_with_require_api_key_a_credential_not_ours_is_a_malformed_key_and_none_a_required_one(
    tier: Tier, settings: Any, django_user_model: Any
) -> None:
    use(settings, REQUIRE_API_KEY=True)
    jwt = factory.get("/api/things", REMOTE_ADDR=IP, HTTP_AUTHORIZATION="Bearer eyJhbGciOiJIUzI1NiJ9.e30.c2ln")
    token = factory.get("/api/things", REMOTE_ADDR=IP, HTTP_AUTHORIZATION="Token 9944b09199c62bcf9418ad846dd0e4")
    assert [plan(r).refusal for r in (jwt, request("team-key"), token, request())] == \
        ["malformed API key", "malformed API key", "API key required", "API key required"]
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    jwt.user = bob  # a signed-in user is served under their tier, whatever else the request carries
    assert plan(jwt).identity == f"user:{bob.pk}" and plan(jwt).refusal == ""


def test_without_a_user_the_anonymous_tier_counts_per_ip(tier: Tier, settings: Any) -> None:
    use(settings, ANONYMOUS_TIER="planned", REQUIRE_API_KEY=False)
    planned = plan(request())
    assert [c.identity for c in planned.checks] == [f"ip:{IP}", f"ip:{IP}"] and planned.label == "planned"


@pytest.mark.parametrize(("setting", "where"), [("ANONYMOUS_TIER", "RATELIMIT['ANONYMOUS_TIER']"),
                                                ("DEFAULT_USER_TIER", "RATELIMIT['DEFAULT_USER_TIER']")])
def test_a_setting_naming_a_missing_tier_is_improperly_configured(settings: Any, django_user_model: Any,
                                                                  setting: str, where: str) -> None:
    use(settings, **{setting: "nosuchtier"}, REQUIRE_API_KEY=False)
    user = django_user_model.objects.create_user("carol", password="pw-carol-123")
    with pytest.raises(ImproperlyConfigured, match=rf"{where.replace('[', '.').replace(']', '.')} names tier "
                                                   r"'nosuchtier', which does not exist"):
        plan_request(request(user=user if setting == "DEFAULT_USER_TIER" else None))


def test_a_deny_rule_is_a_403_outcome_made_without_redis(tier: Tier) -> None:
    ClientRule.objects.create(action="deny", network="198.51.100.0/24")
    refused = plan_request(request(make_key(tier)))
    assert isinstance(refused, LimitOutcome)
    assert (refused.status, refused.message, refused.charged) == \
        (FORBIDDEN, "client network refused by an access rule", False)


def test_an_allow_rule_plans_no_checks_and_takes_none_added(tier: Tier) -> None:
    ClientRule.objects.create(action="allow", network="198.51.100.0/24")
    planned = plan(request(make_key(tier)))
    assert planned.checks == () and planned.listed == "allow" and planned.label == "planned"
    assert planned.plus([LimitCheck("throttle:x", (Policy("x", "fixed_window", limit=1, period=60),))]) is planned


def test_plus_adds_checks_to_a_plan_in_order() -> None:
    base = RequestPlan((LimitCheck("ip:1", ()),), None, "ip:1", "open")
    extra = LimitCheck("throttle:x", (Policy("x", "fixed_window", limit=1, period=60),), "mine")
    assert base.plus([extra]).checks == (*base.checks, extra)
    assert base.plus([]) is base
    assert base._replace(listed="allow").plus([extra]).checks == base.checks


def test_the_fleet_check_comes_last_when_the_shedder_is_on(tier: Tier, settings: Any) -> None:
    use(settings, SHED_CAPACITY=100, SHED_PRIORITIES={"/reports/": "low"})
    key = make_key(tier)
    planned = plan(request(key))
    assert [c.identity for c in planned.checks][-1] == FLEET_IDENTITY and planned.checks[-1].owner == "shed.normal"
    # a gateway's request describes another one: its path picks the priority, the client is still this one's
    described = plan(request(key, path="/gateway/authorize"), path="/reports/2027")
    assert described.checks[-1].owner == "shed.low" and described.identity == planned.identity
