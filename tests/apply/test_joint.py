"""ratelimit_app.apply.joint: the joint decision of our throttles whatever the framework. `decide_jointly`
(its carrier, one call over every member's checks and the view's own, members refused outright),
`Joint.verdict` (what each member answers for), `decide_jointly` (slots held, the outcome left for the
headers, the fail mode when the limiter fails), `joint_of`, `request_charge`, `ThrottleHooks`,
`_throttle_policy`; against the real Redis and database."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory

from ratelimit_app import Decision, Policy, PolicyResult
from ratelimit_app.apply.admission import end, state_of
from ratelimit_app.apply.joint import (
    Joint,
    ThrottleHooks,
    _throttle_label,
    _throttle_policy,
    decide_jointly,
    joint_of,
    request_charge,
    retry_wait,
)
from ratelimit_app.apply.limitcheck import LimitCheck
from ratelimit_app.apply.outcome import ALLOWED, DENIED, UNAUTHORIZED
from ratelimit_app.apply.planning import FROM_REQUEST
from ratelimit_app.decorators import limit_cost
from ratelimit_app.service.limiter import get_limiter
from tests.support.limits_support import make_key, make_tier

factory = RequestFactory()


@dataclass(frozen=True)
class _Member:
    """A throttle as the joint decision sees it."""

    owner: str
    limit: int | None = 5  # None: a rate of 0, refused outright; -1: does not limit the request
    carries_request_limits: bool = False

    def metrics_label(self) -> str:
        return f"label-{self.owner}"

    def checks(self) -> list[LimitCheck] | None:
        if self.limit is None:
            return None
        if self.limit < 0:
            return []
        return [LimitCheck(f"throttle:{self.owner}", (Policy(self.owner, "fixed_window", limit=self.limit,
                                                             period=60),), self.owner)]


def decide(*members: _Member, request: Any = None, with_request_limits: bool = False, extra: Any = (),
           checks_of: Any = None) -> Joint:
    throttles: Any = members  # (stands for throttles: the joint decision reads what _Member has)
    return decide_jointly(request or factory.get("/api/things", REMOTE_ADDR="192.0.2.44"), "handler", throttles,
                          checks_of or (lambda member: member.checks()), cost=1, scope="", user=FROM_REQUEST,
                          request_limits=with_request_limits, where="test", extra=extra)


def test_the_carrier_is_the_member_carrying_the_requests_limits_else_the_first() -> None:
    first, tier = _Member("first", -1), _Member("tier", -1, carries_request_limits=True)
    assert decide(first, tier).carrier == "tier"
    assert decide(first, _Member("second", -1)).carrier == "first"


def test_one_call_charges_every_member_or_none_and_each_answers_for_its_own_limits() -> None:
    roomy, tight = _Member("roomy", 5), _Member("tight", 1)
    assert decide(roomy, tight).outcome.allowed
    joint = decide(roomy, tight)
    assert joint.outcome.status == DENIED
    assert joint.verdict("tight")[0] is True
    refused, roomy_decision = joint.verdict("roomy")
    assert not refused and roomy_decision is not None and roomy_decision.remaining == 4  # charged once only
    assert get_limiter().peek("throttle:roomy", (Policy("roomy", "fixed_window", limit=5, period=60),)).remaining == 4


def test_a_member_refused_outright_stops_the_call_and_one_that_does_not_limit_has_no_decision() -> None:
    joint = decide(_Member("open", -1), _Member("zero", None), _Member("roomy"))
    assert (joint.outcome.status, joint.outcome.decision, joint.denied_outright) == (DENIED, None, {"zero"})
    assert joint.verdict("zero") == (True, None) and joint.verdict("open") == (False, None)
    nothing = decide(_Member("open", -1))
    assert nothing.outcome.status == ALLOWED and nothing.verdict("open") == (False, None)


def test_refused_says_whether_any_member_refuses_and_not_when_only_the_views_own_limit_did() -> None:
    roomy, tight = _Member("roomy", 5), _Member("tight", 1)
    assert not decide(roomy, tight).refused
    assert decide(roomy, tight).refused
    assert decide(_Member("zero", None)).refused
    own = LimitCheck("view:refused", (Policy("own", "fixed_window", limit=1, period=60),), "view")
    assert not decide(_Member("open", -1), extra=lambda: [own]).refused
    by_the_view = decide(_Member("open", -1), extra=lambda: [own])
    assert by_the_view.outcome.status == DENIED and not by_the_view.refused  # no throttle of ours refused


def test_the_joint_is_kept_on_the_request_for_its_handler() -> None:
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.47")
    assert joint_of(request) is None
    joint = decide(_Member("roomy"), request=request)
    assert joint_of(request) is joint and joint_of(request, "handler") is joint
    assert joint_of(request, "another handler") is None  # dispatched again: decided again
    assert (joint.cost, joint.owners, joint.carrier) == (1, ("roomy",), "roomy")


def test_request_charge_is_what_the_middleware_left_else_the_declared_route() -> None:
    @limit_cost(3, scope="search", methods=["POST"])
    def view(request: Any) -> None: ...

    assert request_charge(factory.post("/api/things"), view) == (3, "search", False)
    assert request_charge(factory.get("/api/things"), view) == (1, "search", False)
    assert request_charge(factory.get("/api/things"), None) == (1, "", False)
    left = factory.get("/api/things")
    state_of(left).deferred = (5, "bulk")
    assert request_charge(left, view) == (5, "bulk", True)
    assert request_charge(left, view) == (1, "search", False)  # taken once


def test_the_views_own_checks_are_asked_for_during_the_call_and_decided_with_it() -> None:
    asked: list[int] = []
    own = LimitCheck("view:own", (Policy("own", "fixed_window", limit=1, period=60),), "view")

    def extra() -> list[LimitCheck]:
        asked.append(1)
        return [own]

    assert decide(_Member("roomy"), extra=extra).outcome.allowed
    refused = decide(_Member("roomy"), extra=extra)
    assert asked == [1, 1] and refused.outcome.status == DENIED and refused.verdict("roomy")[0] is False
    assert decide(_Member("zero", None), extra=extra).outcome.decision is None
    assert asked == [1, 1]  # refused outright: nothing else asked


@pytest.mark.django_db
def test_the_carrier_answers_for_the_requests_own_limits() -> None:
    key = make_key(make_tier("jointtier", [("minute", "fixed_window", 1, 60, None, "")]))
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.45", HTTP_X_API_KEY=key)
    carrier, other = _Member("tier", -1, carries_request_limits=True), _Member("roomy")
    assert decide(carrier, other, request=request, with_request_limits=True).outcome.allowed
    joint = decide(carrier, other, request=request, with_request_limits=True)
    refused, base = joint.verdict("tier")
    assert refused and base is not None and base.policy == "minute"
    assert joint.verdict("roomy")[0] is False  # its own limit allowed
    unusable = factory.get("/api/things", REMOTE_ADDR="192.0.2.45", HTTP_X_API_KEY="nope")
    assert decide(carrier, request=unusable, with_request_limits=True).outcome.status == UNAUTHORIZED


def test_the_slots_taken_are_held_on_the_request_and_the_outcome_left_for_the_headers() -> None:
    slot = Policy("inflight", "concurrency", limit=1, period=30)
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.46")
    outcome = decide(_Member("slots"), request=request,
                     checks_of=lambda member: [LimitCheck("throttle:slots", (slot,), member.owner)]).outcome
    assert outcome.allowed and state_of(request).outcome is outcome
    assert len(state_of(request).slots) == 1
    assert get_limiter().peek("throttle:slots", (slot,)).remaining == 0
    end(request)
    assert get_limiter().peek("throttle:slots", (slot,)).remaining == 1


def test_a_limiter_that_fails_follows_the_fail_mode(settings: Any) -> None:
    def broken(member: _Member) -> list[LimitCheck] | None:
        raise RuntimeError("a bug in a throttle")

    assert decide(_Member("x"), checks_of=broken).outcome.status == ALLOWED
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "closed"}
    assert not decide(_Member("x"), checks_of=broken).outcome.allowed


def test_a_throttle_class_that_sets_a_cache_is_refused_when_it_is_defined() -> None:
    class Base(ThrottleHooks):
        cache_throttle = "framework.SimpleRateThrottle"

    with pytest.raises(ImproperlyConfigured, match=r"\.Cached\.cache: .* subclass framework.SimpleRateThrottle"):
        type("Cached", (Base,), {"cache": object()})
    plain = type("Plain", (Base,), {})()
    assert plain.throttle_success() is True and plain.throttle_failure() is False


def test_throttle_policy_names_each_scope_safely_and_apart() -> None:
    assert _throttle_policy("uploads", 0, 60, "sliding_window") is None  # a rate of 0
    assert _throttle_policy("uploads", 5, 60, "gcra") == Policy("uploads", "gcra", limit=5, period=60)
    colon, semicolon = (_throttle_policy(scope, 5, 60, "gcra") for scope in ("contacts:create", "contacts;create"))
    assert colon is not None and semicolon is not None and colon.name != semicolon.name
    assert colon.name.startswith("contacts_create-") and len(colon.name) == len("contacts_create-") + 8
    long = _throttle_policy("é" * 200, 5, 60, "gcra")
    assert long is not None and len(long.name) <= 64
    assert _throttle_policy("uploads", 5, 60, "gcra") is _throttle_policy("uploads", 5, 60, "gcra")


def test_throttle_label_names_a_user_or_an_address_else_the_scope_and_a_digest() -> None:
    drf = "throttle_%(scope)s_%(ident)s"
    assert _throttle_label("user", "throttle_user_7", drf, 7, lambda: "192.0.2.1") == "user:7"
    assert _throttle_label("user", "throttle_user_192.0.2.1", drf, None, lambda: "192.0.2.1") == "ip:192.0.2.1"
    assert _throttle_label("anon", "throttle_anon_2001:db8::/64", drf, None, lambda: "2001:db8::/64") == \
        "ip:2001:db8::/64"
    custom = _throttle_label("login", "throttle_login_alice@example.com", drf, None, lambda: "192.0.2.1")
    assert custom.startswith("throttle.login:#") and len(custom) == len("throttle.login:#") + 12
    assert "alice" not in custom
    assert _throttle_label("login", "other-format-7", drf, 7, lambda: None).startswith("throttle.login:#")


def test_retry_wait_is_the_refusing_decisions_retry_time_at_least_the_floor() -> None:
    refused = Decision.from_results((PolicyResult("tight", False, 1, 0, 0.2, 0.2),))
    assert retry_wait(refused, 1.0) == 1.0 and retry_wait(refused, 0.001) == 0.2
    assert retry_wait(Decision.from_results((PolicyResult("tight", False, 1, 0, 0.0, math.inf),)), 1.0) is None
    assert retry_wait(Decision.from_results((PolicyResult("tight", True, 1, 0, 5.0, None),)), 1.0) is None
    assert retry_wait(None, 1.0) is None
