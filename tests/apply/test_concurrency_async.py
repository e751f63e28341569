"""ratelimit_app.apply.concurrency_async, the async twin of ratelimit_app.apply.concurrency's module functions:
`release_pending_now` and `release_after` give slots back through the async service, against the real Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from ratelimit_app.apply import concurrency_async
from ratelimit_app.apply.concurrency import PENDING_ATTRIBUTE, hold
from tests.apply.test_concurrency import closed_by_the_server, free, take


def test_release_pending_now_gives_every_held_slot_back_at_once() -> None:
    request = RequestFactory().get("/api/users")
    hold(request, take("a"))
    hold(request, take("b"))
    assert (free("a"), free("b")) == (0, 0)
    asyncio.run(concurrency_async.release_pending_now(request))
    assert (free("a"), free("b")) == (1, 1) and PENDING_ATTRIBUTE not in request.__dict__
    asyncio.run(concurrency_async.release_pending_now(request))  # nothing held any more: nothing to do


@pytest.mark.parametrize("middleware", [True, False])
def test_release_after_data_waits_for_the_middleware_or_gives_back_at_once(settings: Any, middleware: bool) -> None:
    """An operation's data (a dict) becomes a response later: the middleware, when installed, gives the slot
    back with that response; without it the view's work is over and the slot goes back at once."""
    settings.MIDDLEWARE = ["ratelimit_app.middleware.RateLimitMiddleware"] if middleware else []
    request = RequestFactory().get("/api/users")
    asyncio.run(concurrency_async.release_after(request, {"data": 1}, take("a")))
    assert free("a") == (0 if middleware else 1)
    assert bool(request.__dict__.get(PENDING_ATTRIBUTE)) is middleware


def test_release_after_a_response_ties_the_slot_to_it() -> None:
    request = RequestFactory().get("/api/users")
    response = HttpResponse("ok")
    asyncio.run(concurrency_async.release_after(request, response, take("a")))
    assert free("a") == 0
    closed_by_the_server(response)
    assert free("a") == 1
