"""Usage limits on the demo under real servers (gunicorn with threads, uvicorn), over HTTP: the pro tier's
2,000 tokens a minute on POST /api/llm/chat, each request reserving its max_tokens and settled at the
tokens it streamed (one every 10 ms), against the shared Redis under the test's key prefix.

- 30 requests one after another, max_tokens 500 and use 100: exactly 16 admitted (15 x 100 used and 500
  reserved make 2,000), the rest refused with a 429 naming the token limit;
- 20 concurrent requests of max_tokens 500 streaming 100 tokens (about a second): exactly 4 admitted;
- clients that go away mid-stream: their reservations are settled at what was sent to them.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import django
import pytest
import redis
import requests

from devtools.embedded import free_port
from tests.conftest import delete_prefix
from tests.support.gunicorn_server import prepare_database, start_server, stop_server

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent

SETUP = """
import json
from ratelimit_app.models import ApiKey, Tier
pro = Tier.objects.get(slug="pro")
print(json.dumps({name: ApiKey.objects.create_key(name=name, tier=pro)[1] for name in ("seq", "race", "cut")}))
"""


@dataclass
class Site:
    kind: str
    url: str
    port: int
    keys: dict[str, str]


@pytest.fixture(scope="module", params=["gunicorn", "uvicorn"])
def site(request: Any, tmp_path_factory: Any, redis_url: str) -> Iterator[Site]:
    kind = request.param
    tmp = tmp_path_factory.mktemp(f"usage-{kind}")
    prefix = f"rltest-usage-{os.urandom(6).hex()}"
    env = {**os.environ, "REDIS_URL": redis_url, "RATELIMIT_TEST_PREFIX": prefix,
           "DJANGO_SETTINGS_MODULE": "tests.support.asgi_server_settings",
           "DATABASE_URL": f"sqlite:///{tmp / 'db.sqlite3'}", "RATELIMIT_LOG_LEVEL": "WARNING", "ASGI_THREADS": "32"}
    keys = prepare_database(env, SETUP)
    port = free_port()
    if kind == "gunicorn":
        command = [str(BIN / "gunicorn"), "project.wsgi:application", "--workers", "2", "--threads", "24",
                   "--worker-class", "gthread", "--bind", f"127.0.0.1:{port}", "--timeout", "120"]
    else:
        command = [str(BIN / "uvicorn"), "project.asgi:application", "--port", str(port), "--log-level", "warning"]
    process = start_server(command, port, env, wait=60)
    try:
        yield Site(kind, f"http://127.0.0.1:{port}", port, keys)
    finally:
        stop_server(process)
        client = redis.Redis.from_url(redis_url)
        delete_prefix(client, prefix)
        client.close()


def chat(site: Site, key: str, max_tokens: int, use: int) -> tuple[int, int, dict[str, Any]]:
    """POST /api/llm/chat, its stream read to the end: status, lines received, JSON body of a refusal."""
    response = requests.post(f"{site.url}/api/llm/chat", json={"max_tokens": max_tokens, "use": use},
                             headers={"X-API-Key": key}, stream=True, timeout=30)
    with response:
        if response.status_code != 200:
            return response.status_code, 0, response.json()
        return 200, sum(1 for line in response.iter_lines() if line), {}


def tokens_left(site: Site, key: str) -> int:
    status = requests.get(f"{site.url}/api/rate-limit/status", headers={"X-API-Key": key}, timeout=10).json()
    (row,) = [row for row in status["limits"] if row["name"] == "llm.tokens"]
    return int(row["remaining"])


def test_thirty_requests_in_a_row_admit_exactly_sixteen(site: Site) -> None:
    results = [chat(site, site.keys["seq"], 500, 100) for _ in range(30)]
    assert [status for status, _, _ in results] == [200] * 16 + [429] * 14
    assert all(lines == 100 for status, lines, _ in results if status == 200)
    refusal = results[16][2]
    assert (refusal["policy"], refusal["unit"]) == ("llm.tokens", "tokens") and refusal["retry_after"] > 0
    assert tokens_left(site, site.keys["seq"]) == 2000 - 16 * 100  # every reservation settled exactly


def test_twenty_concurrent_streams_admit_exactly_four(site: Site) -> None:
    start = threading.Barrier(20)
    results: list[tuple[int, int, dict[str, Any]]] = []

    def one() -> None:
        start.wait()
        results.append(chat(site, site.keys["race"], 500, 100))

    threads = [threading.Thread(target=one) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = [status for status, _, _ in results]
    assert statuses.count(200) == 4 and statuses.count(429) == 16
    assert tokens_left(site, site.keys["race"]) == 2000 - 4 * 100


def _cut_off(site: Site, key: str, after_lines: int) -> None:
    """A client that reads `after_lines` tokens of a stream of 100 and then drops its connection."""
    body = json.dumps({"max_tokens": 500, "use": 100}).encode()
    with socket.create_connection(("127.0.0.1", site.port), timeout=10) as connection:
        connection.sendall(b"POST /api/llm/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                           b"X-API-Key: %s\r\nContent-Length: %d\r\n\r\n%s" % (key.encode(), len(body), body))
        received = b""
        while received.count(b"token ") < after_lines:
            chunk = connection.recv(4096)
            assert chunk, received
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


def test_clients_that_go_away_mid_stream_are_charged_what_they_were_sent(site: Site) -> None:
    key = site.keys["cut"]
    threads = [threading.Thread(target=_cut_off, args=(site, key, 20)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gone = time.monotonic()
    # while they streamed, 3 x 500 were reserved; once settled, each is charged the 20-odd tokens it was
    # sent before the server saw it go (well under the 100 of a whole stream)
    deadline = gone + 10
    left = tokens_left(site, key)
    while left < 2000 - 3 * 100 and time.monotonic() < deadline:
        time.sleep(0.02)
        left = tokens_left(site, key)
    print(f"{site.kind}: settled {time.monotonic() - gone:.3f}s after the clients went away, {2000 - left} charged")
    if site.kind == "uvicorn" and django.VERSION < (5, 0):
        # Django 4.2's ASGI handler does not listen for the client's disconnect while it streams: each
        # stream runs to its end (the server drops what it sends) and is charged the 100 it produced
        assert left == 2000 - 3 * 100
    else:
        assert 2000 - 3 * 100 < left <= 2000 - 3 * 20
