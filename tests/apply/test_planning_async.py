"""ratelimit_app.apply.planning_async, the async twin of ratelimit_app.apply.planning: `plan_request` makes
the same plan, on the event loop from a warm cache and in one thread hop from a cold one, and
`request_user` reads a session's user without blocking; against the real database and Redis."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.contrib.auth import get_user, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.utils.functional import SimpleLazyObject

from ratelimit_app.apply import planning_async
from ratelimit_app.models import Tier
from ratelimit_app.plans.lookups import get_lookups
from tests.apply.test_planning import plan, request
from tests.support.limits_support import make_key, make_tier, record_planning_threads
from tests.test_asgi import run

pytestmark = pytest.mark.django_db


@pytest.fixture
def tier() -> Tier:
    return make_tier("plannedasync", [("minute", "fixed_window", 10, 60, None, "")])


def test_a_warm_plan_is_made_on_the_event_loop_and_is_the_same_plan(tier: Tier, monkeypatch: Any) -> None:
    key = make_key(tier)
    planned = plan(request(key))  # warms this process' lookup cache
    threads = record_planning_threads(monkeypatch)
    assert asyncio.run(planning_async.plan_request(request(key))) == planned
    assert threads == [threading.get_ident()]  # asyncio.run runs the loop in this thread: no hop


@pytest.mark.django_db(transaction=True)  # the thread's own connection sees the rows
def test_a_cold_plan_is_made_once_more_in_a_thread_and_is_the_same_plan(tier: Tier, monkeypatch: Any) -> None:
    key = make_key(tier)
    planned = plan(request(key))
    get_lookups().clear_local()  # a cold cache: the key and the tier must be read again
    threads = record_planning_threads(monkeypatch)
    assert run(lambda: planning_async.plan_request(request(key))) == planned
    assert len(threads) == 2 and threads[0] == threading.get_ident() and threads[1] != threads[0]


@pytest.mark.django_db(transaction=True)  # the session is read in a thread, on a connection of its own
def test_request_user_reads_the_session_user_and_leaves_it_on_the_request() -> None:
    user = get_user_model().objects.create_user("planner", password="not-used")
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.save()
    made = request()
    made.session = SessionStore(session.session_key)
    made.user = SimpleLazyObject(lambda: get_user(made))
    found = run(lambda: planning_async.request_user(made))
    assert found == user and made.user == user
    assert isinstance(made.__dict__["user"], type(user))  # no longer lazy: the view reads it without I/O
    assert run(lambda: planning_async.request_user(request())) is None  # no user: anonymous
