"""ratelimit_app.apply.limiting_async, the async twin of ratelimit_app.apply.limiting: `limit_request` asks
for the extra checks once the user is known, `decide` makes the same call and reads it the same way (a
report-only call included), and `safely` answers the limiter's own failures with the fail mode; against
the real Redis and database."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from ratelimit_app.apply import limiting, limiting_async
from ratelimit_app.apply.limitcheck import LimitCheck
from ratelimit_app.apply.limiting import ALLOWED, DENIED, UNAVAILABLE, LimitOutcome, limit_request
from ratelimit_app.apply.planning import plan_request
from tests.apply.test_limiting import TIGHT, ip_remaining, request
from tests.support.limits_support import make_key, make_tier

pytestmark = pytest.mark.django_db


def cause() -> str:
    """An error message no other test raises (each cause is logged with its traceback once per process)."""
    return f"broken setting {uuid.uuid4().hex}"


def test_on_an_event_loop_the_extra_checks_are_asked_for_once_the_user_is_known() -> None:
    key = make_key(make_tier("asyncextras", [("minute", "fixed_window", 10, 60, None, "")]))
    assert limit_request(request(key)).allowed  # the key is in this process' lookup cache now: no I/O below
    asked: list[int] = []

    def extra() -> list[LimitCheck]:
        asked.append(1)
        return [LimitCheck("throttle:tight", (TIGHT,), "mine")]

    first = asyncio.run(limiting_async.limit_request(request(key), extra=extra))
    second = asyncio.run(limiting_async.limit_request(request(key), extra=extra))
    assert (first.status, second.status, len(asked)) == (ALLOWED, DENIED, 2)
    assert second.decision is not None and second.decision.policy == "tight"


def test_safely_answers_a_failing_coroutine_with_the_fail_mode(settings: Any) -> None:
    async def broken() -> LimitOutcome:
        raise RuntimeError(cause())

    async def fine() -> LimitOutcome:
        return LimitOutcome(DENIED, None, (), None, "ip:1")

    assert asyncio.run(limiting_async.safely(broken, where="the test")).status == ALLOWED
    assert asyncio.run(limiting_async.safely(fine, where="the test")).status == DENIED
    settings.RATELIMIT = {**settings.RATELIMIT, "FAIL_MODE": "closed"}
    assert asyncio.run(limiting_async.safely(broken, where="the test")).status == UNAVAILABLE


def test_decide_reads_the_call_as_the_sync_twin_does_and_a_report_charges_the_ip_alone() -> None:
    key = make_key(make_tier("asyncdecide", [("minute", "fixed_window", 2, 60, None, "")]))
    plan = plan_request(request(key))
    assert not isinstance(plan, LimitOutcome)
    charged = asyncio.run(limiting_async.decide(plan, 1))
    assert charged.status == ALLOWED and [p.name for p in charged.policies] == ["ip", "minute"]
    assert charged.decision is not None and charged.decision.remaining == 1 and ip_remaining() == 99
    report = asyncio.run(limiting_async.decide(plan, 0))  # where the client stands: charges the per-IP limit alone
    assert report.status == ALLOWED and not report.charged and ip_remaining() == 98
    assert report.decisions[1] is not None and report.decisions[1].remaining == 1
    assert limiting.decide(plan, 1).status == ALLOWED
    refused = asyncio.run(limiting_async.decide(plan, 1))
    assert refused.status == DENIED and refused.decision is not None and refused.decision.policy == "minute"
