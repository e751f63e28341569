"""ratelimit_app.apply.admission: `admit` (plan, one decision, the slots held, the outcome recorded, the
refusal to send; never raising because of the limiter), `finish` (headers, slots and what waits for the
end tied to the response), `end` and `release_after`, over the one `RequestState` in `request.ratelimit`,
against the real Redis and database."""

from __future__ import annotations

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
    release_after,
    state_if_any,
    state_of,
)
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


def test_throttles_are_asked_first_and_may_refuse_outright_asking_nothing() -> None:
    asked: list[str] = []
    answered: list[LimitOutcome] = []

    def kept(request: Any, outcome: LimitOutcome, cost: int) -> None:
        answered.append(outcome)

    def extra() -> list[LimitCheck]:
        asked.append("extra")
        return []

    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.90")  # no key: the request's limits refuse
    assert admit(request, throttles=Throttles(lambda: None, True), extra=extra, answer=kept) is None
    assert answered == [REFUSED_OUTRIGHT] and asked == [] and outcome_of(request) is None


def test_throttles_alone_decide_their_checks_only_shown_by_label_else_a_digest() -> None:
    tight = Policy("alone", "fixed_window", limit=1, period=60)
    labelled = LimitCheck("throttle:alone-192.0.2.91", (tight,), "o", "ip:192.0.2.91")
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.91")  # no key: not asked for alone
    assert admit(request, throttles=Throttles(lambda: ([labelled], "throttle.alone"), False)) is None
    assert decided(request).identity == "ip:192.0.2.91" and decided(request).status == ALLOWED
    secret = LimitCheck("throttle:account-secret-42", (tight,), "o")
    again = factory.get("/api/things", REMOTE_ADDR="192.0.2.91")
    assert admit(again, throttles=Throttles(lambda: ([secret], "throttle.alone"), False)) is None
    shown = decided(again).identity
    assert shown.startswith("throttle:#") and len(shown) == len("throttle:#") + 12 and "secret" not in shown
    assert admit(again, throttles=Throttles(lambda: ([secret], "x"), False)) is not None
    assert decided(again).status == DENIED
    nothing = factory.get("/api/things", REMOTE_ADDR="192.0.2.91")
    assert admit(nothing, throttles=Throttles(lambda: ([], "x"), False)) is None
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


@pytest.mark.parametrize("middleware", [True, False])
def test_release_after_data_waits_for_the_middleware_or_gives_back_at_once(settings: Any, middleware: bool) -> None:
    """An operation's data (a dict) becomes a response later: the middleware, when installed, gives the slot
    back with that response; without it the view's work is over and the slot goes back at once."""
    settings.MIDDLEWARE = ["ratelimit_app.middleware.RateLimitMiddleware"] if middleware else []
    request = factory.get("/api/users")
    release_after(request, {"data": 1}, take("a"))
    assert free("a") == (0 if middleware else 1)
    state = state_if_any(request)
    assert bool(state is not None and state.slots) is middleware
    end(request)


def test_release_after_a_response_ties_the_slot_to_it() -> None:
    request = factory.get("/api/users")
    response = HttpResponse("ok")
    release_after(request, response, take("a"))
    assert free("a") == 0
    closed_by_the_server(response)
    assert free("a") == 1
