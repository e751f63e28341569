"""The demo's WebSocket echo under a real server: uvicorn with two worker processes sharing one Redis (the
test's own, watched with MONITOR), a real WebSocket client (the `websockets` package), counted exactly.

The free tier allows 5 connects a minute, 2 connections at once (each slot a 15-second lease, renewed while
its connection lives) and 10 messages per 10 seconds (as `migrate` seeds it).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from devtools.embedded import RedisProcess, free_port, start_redis
from ratelimit_app.core.scripts import decide_sha
from tests.support.gunicorn_server import prepare_database, start_server, stop_server
from tests.support.limits_support import poll

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
LEASE = 15  # seconds: the free tier's "websocket.connections" lease
USES = ("connects", "held", "killed", "messages", "race", "quiet", "quiet-connect")

SETUP = f"""
import json
from ratelimit_app.models import ApiKey, Tier
free = Tier.objects.get(slug="free")
print(json.dumps({{use: ApiKey.objects.create_key(name=use, tier=free)[1] for use in {USES!r}}}))
"""


@dataclass
class Site:
    url: str
    keys: dict[str, str]
    server: Any
    redis: RedisProcess
    prefix: str

    def connect(self, use: str, **kwargs: Any) -> ClientConnection:
        # entered here: the tests hold connections open across steps and close them themselves
        return ws_connect(f"{self.url}/ws/echo/?key={self.keys[use]}", open_timeout=10, **kwargs).__enter__()

    def refusal(self, use: str) -> Any:
        """The HTTP answer refusing a connect of `use`'s key (AssertionError when it is accepted)."""
        try:
            with self.connect(use):
                pass
        except InvalidStatus as refused:
            return refused.response
        raise AssertionError("the connect was accepted")


@pytest.fixture(scope="module")
def site(tmp_path_factory: Any) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("websockets")
    redis_server = start_redis()
    prefix = f"rltest-ws-{os.urandom(6).hex()}"
    env = {**os.environ, "REDIS_URL": redis_server.url, "RATELIMIT_TEST_PREFIX": prefix,
           "DJANGO_SETTINGS_MODULE": "tests.support.asgi_server_settings",
           "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}", "RATELIMIT_LOG_LEVEL": "WARNING"}
    keys = prepare_database(env, SETUP)
    port = free_port()
    command = [str(BIN / "uvicorn"), "project.asgi:application", "--port", str(port), "--workers", "2",
               "--log-level", "warning"]
    process = start_server(command, port, env, wait=60)
    try:
        yield Site(f"ws://127.0.0.1:{port}", keys, process, redis_server, prefix)
    finally:
        stop_server(process)
        redis_server.stop()


def echo(ws: ClientConnection, text: str) -> str:
    ws.send(text)
    return str(ws.recv(timeout=10))


def test_the_sixth_connect_within_a_minute_is_refused_before_accept(site: Site) -> None:
    for number in range(5):
        with site.connect("connects") as ws:
            assert echo(ws, f"hello {number}") == f"hello {number}"
    refused = site.refusal("connects")
    assert refused.status_code == 429 and 1 <= int(refused.headers["Retry-After"]) <= 60
    body = json.loads(refused.body)
    assert body["policy"] == "websocket.connects" and body["tier"] == "free"
    assert site.keys["connects"] not in refused.body.decode()


def test_a_third_connection_is_refused_while_two_are_open_and_allowed_once_one_closes(site: Site) -> None:
    first, second = site.connect("held"), site.connect("held")
    refused = site.refusal("held")
    assert refused.status_code == 429 and json.loads(refused.body)["policy"] == "websocket.connections"
    first.close()
    third: list[ClientConnection] = []

    def admitted() -> bool:  # the slot is given back once the server has seen the close
        try:
            third.append(site.connect("held"))
        except InvalidStatus:
            return False
        return True

    assert poll(admitted, 10)
    assert echo(third[0], "still here") == "still here" and echo(second, "me too") == "me too"
    third[0].close()
    second.close()


def test_twelve_messages_get_ten_echoes_and_two_refusals_naming_the_policy(site: Site) -> None:
    with site.connect("messages") as ws:
        answers = [echo(ws, f"message {number}") for number in range(12)]
    assert answers[:10] == [f"message {number}" for number in range(10)]
    for answer in map(json.loads, answers[10:]):
        assert answer["type"] == "ratelimit.refused" and answer["policy"] == "websocket_message.messages"
        assert 0 < answer["retry_after"] <= 10


def test_sixteen_concurrent_connections_admit_exactly_two(site: Site) -> None:
    start, tried = threading.Barrier(16), threading.Barrier(16)
    results: list[Any] = []
    lock = threading.Lock()

    def client() -> None:
        start.wait()
        ws: ClientConnection | None = None
        try:
            ws = site.connect("race")
        except InvalidStatus as refused:
            result: Any = refused.response.status_code
        else:
            result = echo(ws, "in")
        with lock:
            results.append(result)
        tried.wait()  # every connection that got in stays open until all 16 have tried
        if ws is not None:
            ws.close()

    threads = [threading.Thread(target=client) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results, key=str) == [429] * 14 + ["in"] * 2


def test_refused_messages_and_connects_cost_no_redis_call_while_the_retry_time_lasts(site: Site) -> None:
    """A refusal from Redis is remembered by the worker that made it (the deny cache) until its retry time.
    A worker's first answer from its deny cache reads the reset epoch (has anyone reset a client since?),
    which it has never read before, so it asks Redis once more; from then on it makes no decision call."""
    decisions = decide_sha()
    with site.connect("quiet") as ws:
        answers = [echo(ws, str(number)) for number in range(12)]  # 11th: refused by Redis; 12th: the epoch read
        assert [json.loads(answer)["type"] for answer in answers[10:]] == ["ratelimit.refused"] * 2
        with monitored(site.redis.url) as lines:
            refusals = [json.loads(echo(ws, "again")) for _ in range(7)]
        assert all(refusal["policy"] == "websocket_message.messages" for refusal in refusals)
        assert [line for _, line in lines if decisions in line] == []

    for _ in range(5):
        with site.connect("quiet-connect"):
            pass
    with monitored(site.redis.url) as lines:
        statuses = [site.refusal("quiet-connect").status_code for _ in range(20)]
    assert statuses == [429] * 20
    asked = [caller for caller, line in lines if decisions in line and "websocket.connects" in line]
    by_worker = Counter(_owner(int(caller.rsplit(":", 1)[1]), _workers(site.server.pid), local=True)
                        for caller in asked)
    # per worker: its first refusal, and at most once more at its first reading of the reset epoch
    assert 1 <= len(by_worker) <= 2 and set(by_worker.values()) <= {1, 2}, by_worker
    assert sum(by_worker.values()) <= 4 < len(statuses)


@contextmanager
def monitored(url: str) -> Iterator[list[tuple[str, str]]]:
    """Every (client address, line) MONITOR shows while the block runs, read up to a marker sent after it."""
    spy = redis.Redis.from_url(url)
    lines: list[tuple[str, str]] = []
    with redis.Redis.from_url(url).monitor() as monitor:
        yield lines
        spy.execute_command("ECHO", "end-of-test")
        while True:
            raw = monitor.connection.read_response()
            line = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            matched = re.match(r'\S+ \[\d+ (\S+)\] "([^"]*)"', line)
            assert matched is not None, line
            if matched.group(2) == "ECHO" and '"end-of-test"' in line:
                break
            lines.append((matched.group(1), line))
    spy.close()


def _workers(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(pid) for pid in children]


def _owner(port: int, pids: list[int], *, local: bool = False) -> int:
    """The worker among `pids` holding the TCP connection whose remote end (`local`: its own end) has `port`:
    the server end of a client's WebSocket, or a worker's own connection to Redis."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1 if local else 2].split(":")[1], 16) == port:
            inodes.add(fields[9])
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return pid
    raise AssertionError(f"no worker holds the connection from port {port}")


def test_killing_a_worker_frees_its_connections_slots_within_the_lease(site: Site) -> None:
    first, second = site.connect("killed"), site.connect("killed")
    assert site.refusal("killed").status_code == 429
    victim = _owner(first.socket.getsockname()[1], _workers(site.server.pid))
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    with pytest.raises(ConnectionClosed):
        echo(first, "anyone there?")
    third: list[ClientConnection] = []

    def admitted() -> bool:
        try:
            third.append(site.connect("killed"))
        except (InvalidStatus, OSError):
            time.sleep(0.25)
            return False
        return True

    assert poll(admitted, LEASE + 5)
    assert time.monotonic() - killed_at <= LEASE + 5
    third[0].close()
    for ws in (first, second):
        ws.close()
