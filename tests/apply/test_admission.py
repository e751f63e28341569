"""ratelimit_app.apply.admission: `admit` (plan, one decision, the slots held, the outcome recorded, the
refusal to send; never raising because of the limiter), `finish` (headers, slots and what waits for the
end tied to the response), and `end`, over the one `RequestState` in `request.ratelimit`,
against the real Redis and database."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from devtools.embedded import free_port
from ratelimit_app import Policy
from ratelimit_app.apply.admission import (
    REFUSED_OUTRIGHT,
    RequestState,
    Throttles,
    admit,
    end,
    finish,
    outcome_of,
    record,
    state_if_any,
    state_of,
)
from ratelimit_app.apply.admission_async import aadmit
from ratelimit_app.apply.limitcheck import LimitCheck
from ratelimit_app.apply.outcome import ALLOWED, DENIED, NOT_LIMITED, UNAUTHORIZED, UNAVAILABLE, LimitOutcome
from tests.apply.test_concurrency import closed_by_the_server, free, take
from tests.support.limits_support import make_key, make_tier

pytestmark = pytest.mark.django_db
factory = RequestFactory()
SLOT = Policy("inflight", "concurrency", limit=1, period=30)


def decided(request: Any) -> LimitOutcome:
    outcome = outcome_of(request)
    assert outcome is not None
    return outcome


def keyed(key: str, ip: str = "192.0.2.70") -> Any:
    return factory.get("/api/things", REMOTE_ADDR=ip, HTTP_X_API_KEY=key)


def test_the_state_is_one_attribute_made_once() -> None:
    request = factory.get("/api/things")
    assert state_if_any(request) is None and outcome_of(request) is None
    state = state_of(request)
    assert isinstance(state, RequestState) and state_of(request) is state and request.ratelimit is state  # type: ignore[attr-defined]
    assert [name for name in request.__dict__ if "ratelimit" in name] == ["ratelimit"]
    assert outcome_of(object()) is None  # no request of ours


def test_an_admitted_request_has_its_outcome_and_its_headers() -> None:
    key = make_key(make_tier("admitted", [("minute", "fixed_window", 5, 60, None, "")]))
    request = keyed(key)
    assert admit(request) is None
    outcome = decided(request)
    assert outcome.status == ALLOWED and outcome.decision is not None and outcome.decision.remaining == 4
    response = finish(request, HttpResponse("ok"))
    assert response["X-RateLimit-Remaining"] == "4" and response["X-RateLimit-Limit"] == "5"


@pytest.mark.parametrize("awaited", [False, True])
def test_throttles_are_asked_first_and_may_refuse_outright_asking_nothing(awaited: bool) -> None:
    asked: list[str] = []
    answered: list[LimitOutcome] = []

    def kept(request: Any, outcome: LimitOutcome, cost: int) -> None:
        answered.append(outcome)

    def extra() -> list[LimitCheck]:
        asked.append("extra")
        return []

    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.90")  # no key: the request's limits refuse
    throttles = Throttles(lambda: None, True)
    if awaited:
        assert asyncio.run(aadmit(request, throttles=throttles, extra=extra, answer=kept)) is None
    else:
        assert admit(request, throttles=throttles, extra=extra, answer=kept) is None
    assert answered == [REFUSED_OUTRIGHT] and asked == [] and outcome_of(request) is None


@pytest.mark.parametrize("awaited", [False, True])
def test_throttles_alone_decide_their_checks_only_shown_by_label_else_a_digest(awaited: bool) -> None:
    def admitted(request: Any, checks: list[LimitCheck], label: str) -> Any:
        throttles = Throttles(lambda: (checks, label), False)
        return asyncio.run(aadmit(request, throttles=throttles)) if awaited else admit(request, throttles=throttles)

    tight = Policy("alone", "fixed_window", limit=1, period=60)
    labelled = LimitCheck(f"throttle:alone-192.0.2.91-{awaited}", (tight,), "o", "ip:192.0.2.91")
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.91")  # no key: not asked for alone
    assert admitted(request, [labelled], "throttle.alone") is None
    assert decided(request).identity == "ip:192.0.2.91" and decided(request).status == ALLOWED
    secret = LimitCheck(f"throttle:account-secret-42-{awaited}", (tight,), "o")
    again = factory.get("/api/things", REMOTE_ADDR="192.0.2.91")
    assert admitted(again, [secret], "throttle.alone") is None
    shown = decided(again).identity
    assert shown.startswith("throttle:#") and len(shown) == len("throttle:#") + 12 and "secret" not in shown
    assert admitted(again, [secret], "x") is not None
    assert decided(again).status == DENIED
    nothing = factory.get("/api/things", REMOTE_ADDR="192.0.2.91")
    assert admitted(nothing, [], "x") is None
    assert decided(nothing).decision is None


def test_a_refused_request_gets_the_answer_to_send() -> None:
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.71")  # no key: required in these settings
    refusal = admit(request)
    assert refusal is not None and refusal.status_code == 401
    assert decided(request).status == UNAUTHORIZED


def test_a_failing_limiter_answers_with_the_fail_mode(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                          "FAIL_MODE": "closed"}
    key = make_key(make_tier("failing", [("minute", "fixed_window", 5, 60, None, "")]))
    refusal = admit(keyed(key, "192.0.2.72"))
    assert refusal is not None and refusal.status_code == 503


def test_extra_checks_that_raise_follow_the_fail_mode(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "open"}

    def broken() -> list[LimitCheck]:
        raise RuntimeError("a key function's bug")

    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.73")
    assert admit(request, extra=broken, where="test") is None
    decision = decided(request).decision
    assert decided(request).status == ALLOWED and decision is not None and decision.degraded


def test_a_disabled_limiter_decides_nothing(settings: Any) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "ENABLED": False}
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.74")
    assert admit(request) is None and outcome_of(request) is NOT_LIMITED
    assert "X-RateLimit-Limit" not in finish(request, HttpResponse("ok"))


def test_the_slots_an_extra_check_took_go_back_when_the_response_is_closed() -> None:
    key = make_key(make_tier("slotted", [("minute", "fixed_window", 5, 60, None, "")]))
    request = keyed(key, "192.0.2.75")
    assert admit(request, extra=[LimitCheck("client", (SLOT,), "test")]) is None
    assert free() == 0 and len(state_of(request).slots) == 1
    response = finish(request, HttpResponse("ok"))
    assert state_of(request).slots == [] and free() == 0
    closed_by_the_server(response)  # type: ignore[arg-type]
    assert free() == 1


def test_end_gives_back_what_the_request_holds_at_once() -> None:
    request = factory.get("/api/things")
    ended: list[str] = []
    state = state_of(request)
    state.hold(take("a"))
    state.hold(None)  # nothing taken: nothing held
    state.at_end(lambda: ended.append("departed"))
    end(request)
    assert free("a") == 1 and ended == ["departed"] and state.slots == []
    end(request)  # nothing held any more: nothing to do
    assert ended == ["departed"]


def test_what_waits_for_the_end_goes_with_the_response() -> None:
    request = factory.get("/api/things")
    ended: list[str] = []
    state_of(request).at_end(lambda: ended.append("departed"))
    response = finish(request, HttpResponse("ok"))
    assert ended == []
    closed_by_the_server(response)  # type: ignore[arg-type]
    assert ended == ["departed"]


def test_record_holds_the_slots_of_an_outcome_decided_elsewhere() -> None:
    request = factory.get("/api/things")
    outcome = NOT_LIMITED._replace(slots=take("b"))
    assert record(request, outcome) is None and state_of(request).slots == [outcome.slots]
    end(request)
    assert free("b") == 1
    refused = record(request, NOT_LIMITED._replace(status=UNAVAILABLE))
    assert refused is not None and refused.status_code == 503




@pytest.mark.parametrize("awaited", [False, True])
def test_usage_with_throttles_decided_alone_is_a_mistake_named_at_the_call(awaited: bool) -> None:
    # the estimates reserve the tier's usage limits, which throttles decided alone never ask
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.92")
    throttles = Throttles(lambda: ([], "x"), False)
    with pytest.raises(ValueError, match="usage"):
        if awaited:
            asyncio.run(aadmit(request, throttles=throttles, usage=(("tokens", 100),)))
        else:
            admit(request, throttles=throttles, usage=(("tokens", 100),))
    assert outcome_of(request) is None


@pytest.mark.django_db(transaction=True)  # the async planning reads the tier in a thread of its own
@pytest.mark.parametrize("awaited", [False, True])
def test_a_user_given_plans_the_request_that_reserves_usage(awaited: bool, django_user_model: Any) -> None:
    from ratelimit_app.models import TierLimit, UserTier

    tier = make_tier(f"metered-{awaited}", [("minute", "fixed_window", 5, 60, None, "")])
    TierLimit.objects.create(tier=tier, name="tokens", algorithm="fixed_window", limit=1000, period=60,
                             unit="tokens")
    carol = django_user_model.objects.create_user(f"carol-{awaited}", password="pw-carol-123")
    UserTier.objects.create(user=carol, tier=tier)
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.93")  # not logged in: DRF authenticated carol
    usage = (("tokens", 100),)
    if awaited:
        assert asyncio.run(aadmit(request, usage=usage, user=carol)) is None
    else:
        assert admit(request, usage=usage, user=carol) is None
    outcome = decided(request)
    assert outcome.status == ALLOWED and outcome.identity == f"user:{carol.pk}"
    assert [policy.name for policy in outcome.policies] == ["ip", "minute", "tokens"]
