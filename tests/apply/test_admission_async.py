"""ratelimit_app.apply.admission_async, the async twins of ratelimit_app.apply.admission: `aadmit`, `afinish`
and `aend`, awaited on the event loop, against the real Redis and database."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from ratelimit_app.apply.admission import state_of
from ratelimit_app.apply.admission_async import aadmit, aend, afinish
from ratelimit_app.apply.limitcheck import LimitCheck
from ratelimit_app.apply.outcome import ALLOWED, UNAUTHORIZED
from tests.apply.test_admission import SLOT, decided
from tests.apply.test_concurrency import closed_by_the_server, free, take
from tests.support.limits_support import make_key, make_tier

pytestmark = pytest.mark.django_db(transaction=True)
factory = RequestFactory()


def test_aadmit_decides_on_the_loop_and_afinish_adds_the_headers() -> None:
    key = make_key(make_tier("awaited", [("minute", "fixed_window", 5, 60, None, "")]))
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.80", HTTP_X_API_KEY=key)
    checks = [LimitCheck("client", (SLOT,), "test")]

    async def admitted() -> Any:
        refusal = await aadmit(request, extra=lambda: checks)
        return refusal, await afinish(request, HttpResponse("ok"))

    refusal, response = asyncio.run(admitted())
    assert refusal is None and decided(request).status == ALLOWED and response["X-RateLimit-Remaining"] == "4"
    assert free() == 0
    closed_by_the_server(response)
    assert free() == 1


def test_aadmit_answers_a_refusal() -> None:
    request = factory.get("/api/things", REMOTE_ADDR="192.0.2.81")
    refusal = asyncio.run(aadmit(request))
    assert refusal is not None and refusal.status_code == 401 and decided(request).status == UNAUTHORIZED


def test_aend_gives_every_held_slot_back_at_once() -> None:
    request = factory.get("/api/users")
    state = state_of(request)
    state.hold(take("a"))
    state.hold(take("b"))
    assert (free("a"), free("b")) == (0, 0)
    asyncio.run(aend(request))
    assert (free("a"), free("b")) == (1, 1) and state.slots == []
    asyncio.run(aend(request))  # nothing held any more: nothing to do
    asyncio.run(aend(factory.get("/api/users")))  # no state at all


