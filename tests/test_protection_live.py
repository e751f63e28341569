"""Concurrency slots and load shedding over real HTTP: the demo site under gunicorn (WSGI) and uvicorn
(ASGI), one shared Redis, its own SQLite database. What a user would see, measured inside the views."""

from __future__ import annotations

import math
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import django
import pytest
import redis
import requests

from devtools.embedded import RedisProcess, free_port
from ratelimit_app.core.engine_sync import RateLimiter
from ratelimit_app.core.policies import Policy
from tests.conftest import delete_prefix
from tests.support.gunicorn_server import prepare_database, start_server, stop_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SHED_CAPACITY = 10

#: Tiers and keys the tests use, made once in the servers' database by `manage.py shell`.
SETUP = """
import json
from ratelimit_app.models import ApiKey, Tier, TierLimit
short = Tier.objects.create(slug="shortlease", name="Short lease")
TierLimit.objects.create(tier=short, name="minute", algorithm="fixed_window", limit=1000, period=60)
TierLimit.objects.create(tier=short, name="concurrency", algorithm="concurrency", limit=2, period=2)
# the seeded tiers have no concurrency limit: the free tier's keys here hold 2 slots, as staff would set
TierLimit.objects.create(tier=Tier.objects.get(slug="free"), name="concurrency", algorithm="concurrency", limit=2,
                         period=60)
roomy = Tier.objects.create(slug="roomy", name="Two slots, no burst to speak of")
TierLimit.objects.create(tier=roomy, name="minute", algorithm="fixed_window", limit=1000, period=60)
TierLimit.objects.create(tier=roomy, name="concurrency", algorithm="concurrency", limit=2, period=60)
keys = {}
for name, slug in [("slow", "free"), ("stream", "free"), ("gone", "free"), ("kill", "shortlease"),
                   ("shed", "enterprise"), ("critical", "enterprise"), ("paused", "roomy")]:
    keys[name] = ApiKey.objects.create_key(name=name, tier=Tier.objects.get(slug=slug))[1]
print(json.dumps(keys))
"""


@dataclass
class Site:
    """A running server of the demo site: its base URL, process, keys and key prefix."""

    kind: str
    url: str
    process: subprocess.Popen[bytes]
    keys: dict[str, str]
    prefix: str

    def get(self, path: str, key: str, **kwargs: Any) -> requests.Response:
        return requests.get(f"{self.url}{path}", headers={"X-API-Key": self.keys[key]}, timeout=30, **kwargs)

    def remaining(self, key: str) -> dict[str, int]:
        """Where the key stands in each limit (the status endpoint consumes nothing of the tier)."""
        body = self.get("/api/rate-limit/status", key).json()
        return {limit["name"]: limit["remaining"] for limit in body["limits"]}


def _environment(tmp: Path, prefix: str, redis_url: str) -> dict[str, str]:
    return {**os.environ, "REDIS_URL": redis_url, "RATELIMIT_TEST_PREFIX": prefix,
            "DJANGO_SETTINGS_MODULE": "tests.support.protection_server_settings",
            "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}", "RATELIMIT_TEST_SHED_CAPACITY": str(SHED_CAPACITY),
            "ASGI_THREADS": "64", "RATELIMIT_LOG_LEVEL": "WARNING"}


@pytest.fixture(scope="module", params=["gunicorn", "uvicorn"])
def site(request: Any, tmp_path_factory: Any, redis_url: str) -> Iterator[Site]:
    kind = request.param
    tmp = tmp_path_factory.mktemp(f"protection-{kind}")
    prefix = f"rltest-live-{os.urandom(6).hex()}"
    env = _environment(tmp, prefix, redis_url)
    keys = prepare_database(env, SETUP)
    port = free_port()
    if kind == "gunicorn":
        command = [str(BIN / "gunicorn"), "project.wsgi:application", "--workers", "2", "--threads", "40",
                   "--worker-class", "gthread", "--bind", f"127.0.0.1:{port}", "--timeout", "120"]
    else:
        command = [str(BIN / "uvicorn"), "project.asgi:application", "--port", str(port), "--log-level", "warning"]
    process = start_server(command, port, env, wait=60)
    try:
        yield Site(kind, f"http://127.0.0.1:{port}", process, keys, prefix)
    finally:
        stop_server(process)
        client = redis.Redis.from_url(redis_url)
        delete_prefix(client, prefix)
        client.close()


def concurrently(count: int, call: Any) -> list[Any]:
    """`call(i)` for i in range(count), all released at once from their own threads."""
    start = threading.Barrier(count)

    def run(index: int) -> Any:
        start.wait()
        return call(index)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


def poll(condition: Any, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


def test_twenty_slow_requests_of_a_free_key_run_two_at_a_time(site: Site) -> None:
    before = site.remaining("slow")
    assert before["concurrency"] == 2
    responses = concurrently(20, lambda _: site.get("/api/slow?ms=500", "slow"))
    admitted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert admitted and all(r.status_code == 429 for r in refused), [r.status_code for r in refused]
    # measured inside the view: never more than the 2 slots at once
    assert max(r.json()["in_flight_of_kind"] for r in admitted) <= 2
    for response in refused:
        assert response.headers["Retry-After"] == "1" and response.json()["policy"] == "concurrency"
        assert 'concurrency";q=2;qu="concurrent-requests"' in response.headers["RateLimit-Policy"]
    # none of the refused was charged to a rate limit; every slot is free again once they finished
    after = site.remaining("slow")
    assert after["minute"] == before["minute"] - len(admitted)
    assert after["day"] == before["day"] - len(admitted)
    assert poll(lambda: site.remaining("slow")["concurrency"] == 2, 10)


def test_a_streaming_response_holds_its_slot_until_read_or_abandoned(site: Site) -> None:
    # read to the end: the slot is held while the stream runs, and comes back after its last chunk
    with site.get("/api/stream?chunks=10&ms=100", "stream", stream=True) as response:
        chunks = response.iter_lines()
        assert next(chunks) == b"chunk 0"
        assert site.remaining("stream")["concurrency"] == 1
        assert len(list(chunks)) == 9
    assert poll(lambda: site.remaining("stream")["concurrency"] == 2, 10)
    if site.kind == "uvicorn" and django.VERSION < (5, 0):
        return  # Django 4.2's ASGI handler does not notice a disconnect mid-stream (docs/protection.md)
    # abandoned: a 30-second stream (half of its 60-second lease) whose client disconnects after one
    # chunk gives its slot back soon
    client = _raw_get(site, "/api/stream?chunks=600&ms=100", "stream")
    received = b""
    while b"chunk 0" not in received:
        received += client.recv(4096)
    assert received.startswith(b"HTTP/1.1 200") and site.remaining("stream")["concurrency"] == 1
    started = time.monotonic()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # the client goes away mid-stream (a reset, not a clean end)
    assert poll(lambda: site.remaining("stream")["concurrency"] == 2, 20)
    assert time.monotonic() - started < 25  # before the stream's 30 s


def test_a_client_gone_before_the_response_gives_its_slot_back_soon(site: Site) -> None:
    client = _raw_get(site, "/api/slow?ms=1500", "gone")
    assert poll(lambda: site.remaining("gone")["concurrency"] == 1, 10), "the slow request never started"
    started = time.monotonic()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # gone while the view still runs
    # given back once the view has ended (its response closed, or dropped unclosed), not after the 60 s lease
    assert poll(lambda: site.remaining("gone")["concurrency"] == 2, 30)
    assert time.monotonic() - started < 30


def _raw_get(site: Site, path: str, key: str) -> socket.socket:
    host, port = site.url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)), timeout=30)
    client.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {site.keys[key]}\r\n\r\n".encode())
    return client


def test_a_sigkilled_worker_loses_its_slots_for_the_lease_only(site: Site, redis_client: redis.Redis) -> None:
    if site.kind != "gunicorn":
        pytest.skip("a worker killed under its master: gunicorn's (uvicorn runs here as one process)")
    holders = [threading.Thread(target=lambda: _ignore_errors(lambda: site.get("/api/slow?ms=10000", "kill")))
               for _ in range(2)]
    for thread in holders:
        thread.start()
    assert poll(lambda: site.remaining("kill")["concurrency"] == 0, 20), "the two slow requests never started"
    workers = subprocess.run(["pgrep", "-P", str(site.process.pid)], capture_output=True, check=True)
    for pid in workers.stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    seconds, micros = redis_client.time()
    killed_at = seconds * 1_000_000 + micros
    for thread in holders:
        thread.join(timeout=30)
    # the killed requests never gave their slots back: the leases in Redis run out 2 s after they were taken
    limiter = RateLimiter(redis_client, prefix=site.prefix)
    prefix = site.keys["kill"].split(".")[0]
    [slot_key] = limiter.keys(f"key:{prefix}", [Policy("concurrency", "concurrency", limit=2, period=2)])
    leases: list[tuple[bytes, float]] = redis_client.zrange(slot_key, 0, -1, withscores=True)  # type: ignore[assignment]
    expiries = [score for _, score in leases]
    assert len(expiries) == 2 and all(expiry - killed_at <= 2_000_000 for expiry in expiries)
    assert poll(lambda: _status(site, "/api/slow?ms=0", "kill") in (200, 429), 30)  # workers are back
    status = _status(site, "/api/slow?ms=0", "kill")
    if _redis_now(redis_client) < min(expiries):  # decided while both leases were live
        assert status == 429  # still leased
    while _redis_now(redis_client) <= max(expiries):
        time.sleep(0.05)
    assert _status(site, "/api/slow?ms=0", "kill") == 200  # the lease ran out: the slots are free


def _ignore_errors(call: Any) -> None:
    try:
        call()
    except requests.RequestException:
        pass  # the worker serving it was killed


def _status(site: Site, path: str, key: str) -> int:
    try:
        return site.get(path, key).status_code
    except requests.RequestException:
        return 0


def _redis_now(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1_000_000 + micros


def test_shedding_refuses_low_priority_first_and_never_critical(site: Site) -> None:
    stop = threading.Event()
    critical: list[requests.Response] = []

    def critical_stream() -> None:
        while not stop.is_set():
            critical.append(site.get("/api/checkout?ms=200", "critical"))

    streams = [threading.Thread(target=critical_stream) for _ in range(2)]
    for thread in streams:
        thread.start()
    try:
        lows = concurrently(30, lambda _: site.get("/api/export?ms=1500", "shed"))
    finally:
        stop.set()
        for thread in streams:
            thread.join()
    statuses = sorted({r.status_code for r in lows})
    admitted = [r for r in lows if r.status_code == 200]
    shed = [r for r in lows if r.status_code == 503]
    assert statuses == [200, 503] and len(admitted) + len(shed) == 30
    assert all(r.json()["priority"] == "low" and r.headers["Retry-After"] == "1" for r in shed)
    assert critical and all(r.status_code == 200 for r in critical)  # never shed
    # low requests stop at floor(0.8 x 10) = 8 in flight; in flight passes the capacity only by critical
    # requests (2 clients here): the bound of docs/protection.md, measured inside the views
    low_threshold = math.floor(0.8 * SHED_CAPACITY)
    assert max(r.json()["in_flight_of_kind"] for r in admitted) <= low_threshold
    everything = [r.json()["in_flight"] for r in admitted + critical]
    assert max(everything) <= math.floor(0.95 * SHED_CAPACITY) + len(streams)


# -- clients that disconnect under ASGI ------------------------------------------------------------

#: The process shedder's limit of the server below: a low-priority request is refused while more than
#: this many requests (itself included) are in flight in its process.
PROCESS_LIMIT = 2


@pytest.fixture(scope="module")
def uvicorn_site(tmp_path_factory: Any, redis_url: str) -> Iterator[Site]:
    """The demo under uvicorn with the process shedder on (SHED_PROCESS_LIMIT = PROCESS_LIMIT)."""
    tmp = tmp_path_factory.mktemp("protection-disconnect")
    prefix = f"rltest-live-{os.urandom(6).hex()}"
    env = {**_environment(tmp, prefix, redis_url), "RATELIMIT_TEST_SHED_PROCESS_LIMIT": str(PROCESS_LIMIT)}
    keys = prepare_database(env, SETUP)
    port = free_port()
    command = [str(BIN / "uvicorn"), "project.asgi:application", "--port", str(port), "--log-level", "warning"]
    process = start_server(command, port, env, wait=60)
    try:
        yield Site("uvicorn", f"http://127.0.0.1:{port}", process, keys, prefix)
    finally:
        stop_server(process)
        client = redis.Redis.from_url(redis_url)
        delete_prefix(client, prefix)
        client.close()


def _fleet_places(site: Site, client: redis.Redis) -> int:
    """Live places in the fleet shedder's count (its sorted set of leases in Redis)."""
    limiter = RateLimiter(client, prefix=site.prefix)
    [fleet_key] = limiter.keys("shed:fleet", [Policy("shed", "concurrency", limit=1, period=60)])
    return int(client.zcount(fleet_key, f"({_redis_now(client)}", "+inf"))


def test_clients_that_disconnect_keep_their_slots_until_their_views_end(uvicorn_site: Site,
                                                                        redis_client: redis.Redis) -> None:
    site = uvicorn_site
    running = f"{site.prefix}:demo:in-flight:slow"  # the slow views running now, counted by the views
    seen: list[int] = []

    def views_running() -> int:
        seen.append(int(redis_client.get(running) or 0))
        return seen[-1]

    # six slow requests of a free key (2 slots), each client gone 0.5 s after sending it
    for _ in range(6):
        client = _raw_get(site, "/api/slow?ms=8000", "gone")
        assert not poll(lambda: views_running() > 2, 0.5)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
    # the two admitted views still run, and hold the key's two slots and two places in the fleet count
    assert views_running() == 2
    assert site.remaining("gone")["concurrency"] == 0
    assert _fleet_places(site, redis_client) == 2
    # and this process counts them in flight: a low-priority request is shed (2 + itself > 2)
    shed = site.get("/api/export?ms=0", "shed")
    assert shed.status_code == 503 and shed.json()["priority"] == "low"
    # everything comes back once the views have ended
    assert poll(lambda: views_running() == 0, 20)
    assert poll(lambda: site.remaining("gone")["concurrency"] == 2, 10)
    assert poll(lambda: _fleet_places(site, redis_client) == 0, 10)
    assert site.get("/api/export?ms=0", "shed").status_code == 200
    assert max(seen) == 2  # never more than the key's 2 slots at once, measured inside the views


# -- a Redis that pauses -----------------------------------------------------------------------------

def test_a_paused_redis_leaves_no_slot_or_fleet_place_behind(tmp_path: Path, server: RedisProcess) -> None:
    """gunicorn on a redis-server of the test's own, failing open within a 200 ms budget: requests sent
    while Redis is stopped are admitted without a slot; Redis runs their decisions when it resumes, and
    the slots and fleet places those take are given back at once, not after their 60 s leases."""
    prefix = f"rltest-live-{os.urandom(6).hex()}"
    env = {**_environment(tmp_path, prefix, server.url), "RATELIMIT_TEST_FAIL_MODE": "open",
           "RATELIMIT_TEST_BUDGET_MS": "200"}
    keys = prepare_database(env, SETUP)
    port = free_port()
    command = [str(BIN / "gunicorn"), "project.wsgi:application", "--workers", "2", "--threads", "8",
               "--worker-class", "gthread", "--bind", f"127.0.0.1:{port}", "--timeout", "120"]
    process = start_server(command, port, env, wait=60)
    admin = redis.Redis(port=server.port, socket_timeout=10)
    try:
        site = Site("gunicorn", f"http://127.0.0.1:{port}", process, keys, prefix)
        assert all(site.get("/api/users", "paused").status_code == 200 for _ in range(10))  # workers warm
        server.process.send_signal(signal.SIGSTOP)
        try:
            paused = concurrently(8, lambda _: site.get("/api/users", "paused"))
            assert [r.status_code for r in paused] == [200] * 8  # admitted by the fail mode, degraded
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert poll(lambda: site.remaining("paused")["concurrency"] == 2 and _fleet_places(site, admin) == 0, 10)
        held = concurrently(2, lambda _: site.get("/api/slow?ms=1000", "paused"))
        assert [r.status_code for r in held] == [200, 200]  # both slots free, well within the leases
    finally:
        stop_server(process)
        admin.close()
