"""A Django Ninja throttle of ours over real HTTP: the demo site's /ninja/public (AnonRateThrottle("5/m"))
under gunicorn with two worker processes (WSGI), and its `async def` twin /ninja/async/public under
uvicorn (ASGI: the throttle is asked on the event loop). 16 clients x 10 requests at once from one
address: exactly 5 are admitted, whichever process serves them (Ninja's own throttle reads its history
from the cache, then writes it back, so concurrent requests may all pass the read)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from devtools.embedded import free_port

from ..conftest import delete_prefix
from ..support.gunicorn_server import prepare_database, start_server, stop_server

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
CLIENTS, REQUESTS = 16, 10


@pytest.fixture(params=["gunicorn", "uvicorn"])
def server(request: Any, tmp_path: Path, redis_url: str) -> Iterator[tuple[str, str]]:
    """(kind, base URL) of the demo site under a fresh key prefix, with its own SQLite database."""
    prefix = f"rltest-ninja-{os.urandom(6).hex()}"
    env = {**os.environ, "REDIS_URL": redis_url, "RATELIMIT_TEST_PREFIX": prefix,
           "DJANGO_SETTINGS_MODULE": "tests.support.asgi_server_settings",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "RATELIMIT_LOG_LEVEL": "WARNING"}
    prepare_database(env, "print('{}')")
    port = free_port()
    if request.param == "gunicorn":
        command = [str(BIN / "gunicorn"), "project.wsgi:application", "--workers", "2", "--threads", "8",
                   "--worker-class", "gthread", "--bind", f"127.0.0.1:{port}"]
    else:
        command = [str(BIN / "uvicorn"), "project.asgi:application", "--port", str(port), "--log-level", "warning"]
    process = start_server(command, port, env, wait=60)
    try:
        yield request.param, f"http://127.0.0.1:{port}"
    finally:
        stop_server(process)
        client = redis.Redis.from_url(redis_url)
        delete_prefix(client, prefix)
        client.close()


def test_sixteen_clients_at_once_are_admitted_exactly_five_times(server: tuple[str, str]) -> None:
    kind, base = server
    url = f"{base}/ninja/public" if kind == "gunicorn" else f"{base}/ninja/async/public"
    start = threading.Barrier(CLIENTS)

    def client(_: int) -> list[int]:
        with requests.Session() as session:
            start.wait()
            return [session.get(url, timeout=30).status_code for _ in range(REQUESTS)]

    with ThreadPoolExecutor(CLIENTS) as pool:
        statuses = [status for statuses in pool.map(client, range(CLIENTS)) for status in statuses]
    assert len(statuses) == CLIENTS * REQUESTS
    assert statuses.count(200) == 5 and statuses.count(429) == CLIENTS * REQUESTS - 5, sorted(set(statuses))
