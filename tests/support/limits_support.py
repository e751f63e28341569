"""Helpers shared by the tests of tiers, keys, the middleware and the HTTP API (not fixtures: plain calls)."""

from __future__ import annotations

import importlib
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import redis
import requests
from django.apps import apps as django_apps

from ratelimit_app.models import ApiKey, Tier, TierLimit
from ratelimit_app.plans.edits import edits_key

#: (name, algorithm, limit, period, burst, scope)
LimitSpec = tuple[str, str, int, int, "int | None", str]


def seed_tiers() -> None:
    """Restore the tiers the data migration seeds (transactional tests flush the tables)."""
    importlib.import_module("ratelimit_app.migrations.0001_initial").seed_tiers(django_apps)


def set_ip_rate(tier: Tier | str, rate: str) -> None:
    """Set the per-IP rate of `tier` (an object or a slug; "" for RATELIMIT['IP_RATE']), as staff would in
    the admin (the save is announced: every process reloads the tier)."""
    owner = Tier.objects.get(slug=tier) if isinstance(tier, str) else tier
    owner.ip_rate = rate
    owner.full_clean()
    owner.save()


def add_slots(tier: Tier | str, slots: int, lease: int = 60, name: str = "concurrency") -> TierLimit:
    """Give `tier` (an object or a slug) a concurrency limit of `slots` requests in flight, each a lease
    of `lease` seconds, as staff would in the admin (the seeded tiers have none)."""
    owner = Tier.objects.get(slug=tier) if isinstance(tier, str) else tier
    limit = TierLimit(tier=owner, name=name, algorithm="concurrency", limit=slots, period=lease)
    limit.full_clean()
    limit.save()
    return limit


@contextmanager
def redis_commands(redis_url: str, key_prefix: str) -> Iterator[list[str]]:
    """Every command Redis executes that names `key_prefix` (each key this app writes for the test
    does: decisions, shared lookups, metrics) while the block runs, as clients sent them (a script's
    own calls aside, and the edit epoch's reads, which a thread of each process makes once a second,
    off every request's path: ratelimit_app.plans.edits), read from MONITOR up to a marker sent after
    the block (no waiting on time)."""
    client = redis.Redis.from_url(redis_url)
    monitor = client.monitor()
    commands: list[str] = []
    with monitor:
        yield commands
        marker = f"end-of-test-{uuid.uuid4().hex}"
        client.echo(marker)
        while True:
            seen = monitor.next_command()
            command = seen["command"]
            if marker in command:
                break
            if key_prefix in command and seen["client_type"] != "lua" and edits_key(key_prefix) not in command:
                commands.append(command)
    client.close()


def make_tier(slug: str, limits: list[LimitSpec], *, fail_mode: str = "") -> Tier:
    """A tier with exactly these limits (validated like the admin would)."""
    tier = Tier.objects.create(slug=slug, name=slug.title(), fail_mode=fail_mode)
    for name, algorithm, limit, period, burst, scope in limits:
        item = TierLimit(tier=tier, name=name, algorithm=algorithm, limit=limit, period=period, burst=burst,
                         scope=scope)
        item.full_clean()
        item.save()
    return tier


def record_planning_threads(monkeypatch: Any) -> list[int]:
    """The threads in which requests are planned from now on: `planning.plan_with_key`, which the sync
    `plan_request` and its async twin (ratelimit_app.apply.planning_async) both call, appends its thread."""
    from ratelimit_app.apply import planning

    threads: list[int] = []
    original = planning.plan_with_key

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return original(*args, **kwargs)

    monkeypatch.setattr(planning, "plan_with_key", recording)
    return threads


def make_key(tier: Tier | str, name: str = "test key", **kwargs: Any) -> str:
    """Create an API key for `tier` (an object or a slug); return the full key."""
    if isinstance(tier, str):
        tier = Tier.objects.get(slug=tier)
    _, key = ApiKey.objects.create_key(name=name, tier=tier, **kwargs)
    return key


_FIELD = re.compile(r'"([^"]+)"((?:;\w+=(?:\d+|"[a-z-]+"))+)')
_PARAM = re.compile(r';(\w+)=(\d+|"[a-z-]+")')


def parse_ietf(value: str) -> dict[str, dict[str, Any]]:
    """Parse a RateLimit / RateLimit-Policy value into {policy: {param: int, or str for qu}}."""
    parsed = {}
    for member in value.split(", "):
        match = _FIELD.fullmatch(member)
        assert match, f"not a structured-field member: {member!r}"
        name, params = match.groups()
        parsed[name] = {key: value.strip('"') if value.startswith('"') else int(value)
                        for key, value in _PARAM.findall(params)}
    return parsed


def poll(condition: Callable[[], bool], deadline: float) -> bool:
    """Poll `condition` until it holds or `deadline` seconds pass; True when it held."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def attempts(retry: Any) -> int:
    """How many times a redis-py `Retry` runs a call that keeps failing with a connection error (1: no retries).

    Counted by running it, so the answer holds on every redis-py version (Retry.get_retries() is 6.0+).
    """

    calls = []

    def fail() -> None:
        calls.append(1)
        raise redis.ConnectionError("refused")

    try:
        retry.call_with_retry(fail, lambda error: None)
    except redis.ConnectionError:
        pass
    return len(calls)


def race_of_eight_clients(base: str, path: str, key: str) -> tuple[list[int], float]:
    """8 clients, each on its own keep-alive connection to `base`, released at once, send 50 requests
    to `path` with API key `key` in all: their status codes, and how many seconds the race took."""
    per_client = [7, 7, 6, 6, 6, 6, 6, 6]  # 50 requests
    start = threading.Barrier(len(per_client))

    def client(count: int) -> list[int]:
        session = requests.Session()
        session.headers["X-API-Key"] = key
        session.get(f"{base}/health", timeout=10)  # open the connection before the race
        start.wait()
        return [session.get(f"{base}{path}", timeout=10).status_code for _ in range(count)]

    started = time.monotonic()
    with ThreadPoolExecutor(len(per_client)) as pool:
        statuses = [status for result in pool.map(client, per_client) for status in result]
    return statuses, time.monotonic() - started


def check_free_burst(responses: list[Any]) -> dict[str, Any]:
    """Check 11 rapid responses of one free-tier key (`requests` responses): 10 admitted with the
    remaining count falling to 0, the 11th a 429 of the burst bucket with Retry-After and headers that
    say it charged nothing. Returns the 429's parsed `RateLimit` header."""
    assert [r.status_code for r in responses] == [200] * 10 + [429]
    assert [int(r.headers["X-RateLimit-Remaining"]) for r in responses[:10]] == list(range(9, -1, -1))
    for response in responses:
        assert response.headers["X-RateLimit-Limit"] == "10" and response.headers["X-RateLimit-Tier"] == "free"
    denied = responses[-1]
    body = denied.json()
    assert body["error"] == "rate limit exceeded" and (body["tier"], body["policy"]) == ("free", "burst")
    assert 0 < body["retry_after"] <= 3.0  # one token every 3 s
    assert int(denied.headers["Retry-After"]) == max(1, math.ceil(body["retry_after"]))
    live = parse_ietf(denied.headers["RateLimit"])
    assert (live["burst"]["r"], live["minute"]["r"], live["day"]["r"]) == (0, 10, 990)
    return live
