"""The demo site under gunicorn with gevent workers, and under eventlet's WSGI server: 200 concurrent
limited requests stay within the limiter pool's `max_connections`, and every one of them is answered
exactly.

Under gevent or eventlet a thread-local is per greenlet, so the sync engine's per-thread connections would grow
with greenlets; RATELIMIT['CONNECTIONS'] = "auto" takes the pool path there (engine_sync). The server's
limiter reaches Redis through a counting TCP proxy (tests/support/tcp_proxy.py), so every connection it opens
is counted exactly; its lookup cache goes straight to Redis and is not counted.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from devtools.embedded import free_port
from tests.conftest import delete_prefix
from tests.support.gunicorn_server import prepare_database, start_gunicorn, start_server, stop_server
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow
POOL_SIZE = 20  # the limiter pool's max_connections in the server
CONCURRENT = 200
LIMIT = 50  # the key's tier: 50 requests an hour, an exact sliding log

SETUP = f"""
import json
from ratelimit_app.models import ApiKey, Tier, TierLimit
tier = Tier.objects.create(slug="greenlets", name="Greenlets")
TierLimit.objects.create(tier=tier, name="hour", algorithm="sliding_window", limit={LIMIT}, period=3600)
print(json.dumps(ApiKey.objects.create_key(name="gevent", tier=tier)[1]))
"""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class GeventSite:
    port: int
    key: str
    proxy: TcpProxy

    def remaining(self) -> int:
        """What remains of the key's hourly limit (the status endpoint consumes nothing of the tier)."""
        answer = self.get("/api/rate-limit/status")
        assert answer.status == 200, answer
        return int({limit["name"]: limit["remaining"] for limit in answer.body["limits"]}["hour"])

    def get(self, path: str, connection: http.client.HTTPConnection | None = None) -> Answer:
        connection = connection or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request("GET", path, headers={"X-API-Key": self.key})
            response = connection.getresponse()
            body = response.read()
            return Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                          json.loads(body) if body else {})
        finally:
            connection.close()


def start_green_server(server: str, port: int, env: dict[str, str]) -> Any:
    """One process serving every request in a green thread: gunicorn's gevent worker, or eventlet's
    WSGI server."""
    if server == "eventlet":
        return start_server([sys.executable, "-m", "tests.support.eventlet_server", str(port)], port, env)
    return start_gunicorn(port, env, "--worker-class", "gevent", "--workers", "1", "--worker-connections", "1000",
                          "--backlog", "1024", "--timeout", "120")


@pytest.fixture(params=[("gevent", "auto"), ("gevent", "own"), ("eventlet", "auto"), ("eventlet", "own")],
                ids=lambda param: "-".join(param))
def site(request: Any, tmp_path: Path, redis_url: str) -> Iterator[GeventSite]:
    green, connections = request.param
    prefix = f"rltest-gevent-{os.urandom(6).hex()}"
    upstream = urlsplit(redis_url)
    database = upstream.path.lstrip("/") or "0"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.support.gevent_server_settings", "REDIS_URL": redis_url,
           "RATELIMIT_TEST_PREFIX": prefix, "RATELIMIT_TEST_DB": str(tmp_path / "db.sqlite3"),
           "RATELIMIT_TEST_LIMITER_URL": redis_url, "RATELIMIT_TEST_CONNECTIONS": connections,
           "RATELIMIT_LOG_LEVEL": "WARNING"}
    key = prepare_database(env, SETUP)
    # only the server's limiter goes through the proxy: every connection it counts is the server's
    proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 6379)
    env["RATELIMIT_TEST_LIMITER_URL"] = f"redis://127.0.0.1:{proxy.port}/{database}?max_connections={POOL_SIZE}"
    port = free_port()
    server = start_green_server(green, port, env)  # one process: the pool bounds one process's connections
    try:
        yield GeventSite(port, key, proxy)
    finally:
        stop_server(server)
        proxy.close()
        client = redis.Redis.from_url(redis_url)
        delete_prefix(client, prefix)
        client.close()


def fire(site: GeventSite, count: int, path: str) -> list[Answer]:
    """GET `path` from `count` clients at once: each connects first, then all send together."""
    start = threading.Barrier(count)

    def client(_: int) -> Answer:
        connection = http.client.HTTPConnection("127.0.0.1", site.port, timeout=60)
        connection.connect()
        start.wait()
        return site.get(path, connection)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(client, range(count)))


def test_two_hundred_concurrent_requests_in_green_threads(site: GeventSite, request: Any) -> None:
    green, connections = request.node.callspec.params["site"]
    assert site.remaining() == LIMIT  # the key is looked up once, before the burst

    answers = fire(site, CONCURRENT, "/api/users")

    statuses = [answer.status for answer in answers]
    assert statuses.count(200) == LIMIT and statuses.count(429) == CONCURRENT - LIMIT, statuses
    for answer in answers:
        if answer.status == 429:
            assert answer.body["policy"] == "hour" and int(answer.headers["retry-after"]) >= 1
            assert answer.headers["x-ratelimit-remaining"] == "0"
    assert site.remaining() == 0
    opened = site.proxy.connections
    print(f"{green}, connections={connections}: {opened} Redis connections opened, at most {site.proxy.peak} at once")
    if connections == "auto":  # the pool path: never more than the pool holds
        assert site.proxy.peak <= opened <= POOL_SIZE
    else:  # per greenlet: at least one connection for each admitted request's greenlet
        assert opened >= LIMIT > POOL_SIZE
