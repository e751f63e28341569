"""ratelimit_app.apply.concurrency: `HeldSlots` (given back once, never raising), `slots_taken` (which
decisions took slots), `needs_lease`, and how slots are given back with a response (`release_with`) or
by the releasing thread (`call_later`), against the real Redis through the process' limiter service."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from django.core.signals import request_finished
from django.db import close_old_connections
from django.http import HttpResponse

from devtools.embedded import free_port
from ratelimit_app import Decision, Policy, PolicyResult, new_lease_token
from ratelimit_app.apply.concurrency import HeldSlots, call_later, needs_lease, slots_taken
from ratelimit_app.core.decision import degraded_decision
from ratelimit_app.service.limiter import get_limiter

SLOT = Policy("inflight", "concurrency", limit=1, period=30)
MINUTE = Policy("minute", "fixed_window", limit=100, period=60)


def take(identity: str = "client") -> HeldSlots:
    """One slot of `identity`, taken in Redis as a request's decision takes it."""
    token = new_lease_token()
    checks = [(identity, (MINUTE, SLOT))]
    decisions = get_limiter().hit_many(checks, lease=token)
    slots = slots_taken(checks, decisions, token)
    assert slots is not None
    return slots


def free(identity: str = "client") -> int:
    return get_limiter().peek(identity, (SLOT,)).remaining


def closed_by_the_server(response: HttpResponse) -> None:
    """`response.close()` as a server calls it, without the database clean-up its request_finished signal
    runs (Django's test client leaves it out the same way)."""
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)


def allowed(*results: PolicyResult, degraded: bool = False) -> Decision:
    return Decision.from_results(results, degraded=degraded)


def test_release_gives_the_slots_back_once() -> None:
    slots = take()
    assert free() == 0 and repr(slots) == "HeldSlots(inflight; held)"
    slots.release()
    assert free() == 1 and slots.released and repr(slots) == "HeldSlots(inflight; released)"
    other = take()  # another request's slot, under another lease
    slots.release()  # a second release of the first: nothing happens
    assert free() == 0
    other.release()


def test_release_never_raises_when_redis_cannot_be_asked(settings: Any) -> None:
    slots = take()
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    slots.release()  # the slot frees itself when its lease runs out
    assert slots.released


def test_arelease_gives_the_slots_back_through_the_async_service_once() -> None:
    slots = take()

    async def twice() -> None:
        await slots.arelease()
        await slots.arelease()

    asyncio.run(twice())
    assert free() == 1 and slots.released
    slots.release()  # released already, on either path
    assert free() == 1


def test_renew_and_arenew_say_whether_the_slots_were_held_and_never_raise(settings: Any) -> None:
    slots = take()
    assert slots.renew(0.0001) is True  # 1 ms at least: a first lease that runs out at once
    while free() == 0:
        pass  # Redis' clock, read until it has
    assert asyncio.run(slots.arenew()) is False and slots.renew() is False  # ended: not taken again
    assert free() == 1
    held = take()
    assert slots.renew() is False and held.renew(5) is True and asyncio.run(held.arenew()) is True
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    assert held.renew() is None and asyncio.run(held.arenew()) is None  # Redis not asked: never raises
    held.release()
    assert held.renew() is False and asyncio.run(held.arenew()) is False  # released here: nothing to renew


def test_slots_taken_names_the_concurrency_policies_of_the_allowed_decisions_only() -> None:
    ok, no = PolicyResult("x", True, 1, 0, 0.0, None), PolicyResult("x", False, 1, 0, 1.0, 1.0)
    checks = [("ip:1", (MINUTE,)), ("key:a", (MINUTE, SLOT)), ("user:1", (SLOT,)), ("key:b", (SLOT,))]
    decisions = [allowed(ok), allowed(ok, ok), Decision.from_results((no,)), None]
    slots = slots_taken(checks, decisions, "lease-1")
    assert slots is not None and slots.held == (("key:a", SLOT),) and slots.token == "lease-1" and not slots.local
    assert slots_taken(checks, decisions, None) is None  # no lease: nothing was taken
    assert slots_taken([("ip:1", (MINUTE,))], [allowed(ok)], "lease-1") is None  # no concurrency policy
    # the "open" fail mode took nothing (it knows no results); the "local" one took its slots in process
    assert slots_taken([("key:a", (SLOT,))], [degraded_decision(True)], "lease-1") is None
    local = slots_taken([("key:a", (SLOT,))], [allowed(ok, degraded=True)], "lease-1")
    assert local is not None and local.local


def test_needs_lease_whatever_sequence_holds_the_policies() -> None:
    assert needs_lease((MINUTE, SLOT)) and needs_lease([SLOT])
    assert not needs_lease((MINUTE,)) and not needs_lease([]) and not needs_lease([MINUTE])


def test_slots_given_to_the_releasing_thread_go_back_without_blocking_the_caller() -> None:
    slots = take("a")
    call_later(slots.release)
    deadline = time.monotonic() + 10
    while free("a") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert free("a") == 1 and slots.released


@pytest.mark.parametrize("awaited", [False, True])
def test_slots_the_local_fail_mode_took_are_given_back_in_process(settings: Any, awaited: bool) -> None:
    settings.RATELIMIT = {**settings.RATELIMIT, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                          "FAIL_MODE": "local", "APP_SERVERS": 1}
    service = get_limiter()
    token = new_lease_token()
    checks = [("client", (SLOT,))]
    slots = slots_taken(checks, service.hit_many(checks, lease=token), token)
    assert slots is not None and slots.local
    assert not service.hit_many(checks, lease=new_lease_token())[0].allowed
    if awaited:
        asyncio.run(slots.arelease())
    else:
        slots.release()
    assert service.hit_many(checks, lease=new_lease_token())[0].allowed
